# syntax=docker/dockerfile:1
# The cachescale operator image: `docker build -t ghcr.io/cachescale/cachescale:0.1.0 .`
# The Helm chart's default image is ghcr.io/cachescale/cachescale:<appVersion>, so tag the
# build with charts/cachescale/Chart.yaml's appVersion. It runs `cachescale run` as uid
# 10001 on a read-only root filesystem (the chart mounts an emptyDir at /tmp).

ARG PYTHON_VERSION=3.12

# -- build: install the package and its operator extra into a virtualenv ------------------
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel needs (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m venv /opt/cachescale \
    && /opt/cachescale/bin/pip install ".[operator]" \
    && /opt/cachescale/bin/cachescale --help >/dev/null

# -- runtime: the same slim base, the virtualenv, a non-root user -------------------------
FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="cachescale" \
      org.opencontainers.image.description="Prefix-cache-aware autoscaling operator for vLLM/SGLang on Kubernetes" \
      org.opencontainers.image.source="https://github.com/cachescale/cachescale" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 cachescale \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin cachescale
COPY --from=build /opt/cachescale /opt/cachescale
# MALLOC_ARENA_MAX: two glibc malloc arenas, not eight per core (the chart sets it too).
ENV PATH=/opt/cachescale/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
# Numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# 8080: kopf's /healthz and /readyz (--health-port); 9090: the operator's /metrics.
EXPOSE 8080 9090
ENTRYPOINT ["cachescale"]
CMD ["run"]
