"""CPU per python-telegram-bot send against the fake Bot API, in one process:
3,000 `Bot.send_message` calls, 32 at a time, after 200 to warm up.

    PYTHONPATH=. .venv/bin/python bench/_ptb_sends.py LABEL

What bench/README.md's sniffio figures come from: run it, uninstall sniffio
(`.venv/bin/python -m pip uninstall -y sniffio`), run it again, reinstall.
Not part of `make bench` (the comparison needs the package gone).
"""

from __future__ import annotations

import asyncio
import sys
import time

from telegram import Bot

from tests.fakes.telegram import FakeTelegram


async def main(label: str) -> None:
    async with FakeTelegram() as fake:
        fake.add_bot("1:x", 1, "b", "B")
        fake.add_user(7, "A", "a")
        fake.add_chat(-100, "supergroup", "g")
        fake.add_member(-100, 7)
        fake.add_member(-100, 1)
        async with Bot("1:x", base_url=f"{fake.api_base}/bot") as bot:
            for _ in range(200):
                await bot.send_message(-100, "warm")
            places = asyncio.Semaphore(32)

            async def one() -> None:
                async with places:
                    await bot.send_message(-100, "hi")

            started = time.process_time()
            await asyncio.gather(*(one() for _ in range(3000)))
            cpu = (time.process_time() - started) / 3000 * 1e6
            print(f"{label}: {cpu:.0f} us CPU per send (PTB and the fake, one process)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sends"))
