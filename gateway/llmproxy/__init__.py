"""The LLM API proxy (docs/llm-proxy.md): an agent points its OpenAI or
Anthropic base URL at the daemon and changes nothing else; each request's
history shows the tool calls the agent made and their results, which are
fed to the agent guard, and a loop the guard blocks ends with an answer.

- gateway/llmproxy/wire.py: what both APIs share (tool events, usage, SSE);
- gateway/llmproxy/openai.py, anthropic.py: each API's shapes (one mapping each);
- gateway/llmproxy/session.py: which session a request belongs to, and which
  of its tool events the guard has not seen yet;
- gateway/llmproxy/order.py: checks in turns, in the order requests came;
- gateway/llmproxy/proxy.py: the routes, the forwarding and the decision.
"""
