# botbouncer's image (docs/deploy.md). Build from the repository's root:
#   docker build -t botbouncer .
#   docker build --build-arg EXTRAS=telegram -t botbouncer:telegram .   # one platform only
# Run it with a config mounted at /etc/botbouncer/botbouncer.yml (the image's
# default is deploy/botbouncer.yml: Redis at $REDIS_URL, listening on 0.0.0.0:8080);
# deploy/compose.yml runs it beside Redis. Secrets come from the environment
# at run time (${VAR} in the config): none is baked into the image.

ARG PYTHON_IMAGE=python:3.11-slim

# -- build: the package and its dependencies in a virtualenv -----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# What pyproject.toml needs to build the package (.dockerignore keeps the
# context to these files).
COPY pyproject.toml README.md LICENSE ./
COPY gateway ./gateway
COPY adapters ./adapters
COPY botbouncer ./botbouncer
# Extras: all (every platform and `botbouncer mcp-proxy`), or a comma list of
# discord, telegram, aiogram, slack, matrix, mcp; empty: HTTP bots, the agent
# guard and the LLM proxy only. Every dependency ships manylinux wheels, so no
# compiler is needed.
ARG EXTRAS=all
RUN python -m venv /opt/botbouncer \
 && /opt/botbouncer/bin/pip install "/src${EXTRAS:+[${EXTRAS}]}" \
 && /opt/botbouncer/bin/botbouncer --version

# -- run ----------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# A fixed uid/gid, so a volume or a Kubernetes runAsUser can name it.
RUN groupadd --system --gid 10001 botbouncer \
 && useradd --system --uid 10001 --gid botbouncer --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin botbouncer
COPY --from=build /opt/botbouncer /opt/botbouncer
# The default configuration; mount your own over it (read-only is enough:
# the daemon writes nothing to disk).
COPY deploy/botbouncer.yml /etc/botbouncer/botbouncer.yml
ENV PATH=/opt/botbouncer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /etc/botbouncer
EXPOSE 8080
# SIGTERM: stop taking messages, let those in flight finish within
# shutdown.grace_seconds, exit 0. Give `docker stop` more than that
# (compose.yml: stop_grace_period). SIGHUP reloads the config.
STOPSIGNAL SIGTERM
# Liveness: /healthz answers 200 while the daemon runs, "degraded" included
# (a replica without Redis still decides). No curl in the slim image: Python.
# Port 8080 is deploy/botbouncer.yml's default listener: a BOTBOUNCER_LISTEN
# on another port needs `docker run --health-cmd` asking that one.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["botbouncer"]
CMD ["run", "-c", "/etc/botbouncer/botbouncer.yml"]
