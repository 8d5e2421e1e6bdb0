# syntax=docker/dockerfile:1
# The cachescale operator image: `make image` (podman, or docker with CONTAINER_TOOL=docker).
# The Helm chart's default image is ghcr.io/cachescale/cachescale:<appVersion>, so tag the
# build with charts/cachescale/Chart.yaml's appVersion. It runs `cachescale run` as uid
# 10001 on a read-only root filesystem (the chart mounts an emptyDir at /tmp).
#
# BASE_IMAGE: any Debian-like image with python3 (>= 3.11, invoked as `python`), venv,
# libstdc++ and useradd. CI builds on a base made locally from Debian's packages
# (scripts/build-image.sh --local-base), pulling nothing.

ARG BASE_IMAGE=python:3.12-slim

# -- build: install the package and its operator extra into a virtualenv ------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel needs (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The installers leave the runtime venv once the package is in: nothing installs at run time.
RUN python -m venv /opt/cachescale \
    && /opt/cachescale/bin/pip install ".[operator]" \
    && /opt/cachescale/bin/cachescale --version \
    && /opt/cachescale/bin/pip uninstall --yes --quiet pip setuptools

# -- runtime: the same slim base, the virtualenv, a non-root user -------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="cachescale" \
      org.opencontainers.image.description="Prefix-cache-aware autoscaling operator for vLLM/SGLang on Kubernetes" \
      org.opencontainers.image.source="https://github.com/cachescale/cachescale" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 cachescale \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin cachescale
COPY --from=build /opt/cachescale /opt/cachescale
COPY LICENSE /usr/share/doc/cachescale/LICENSE
# MALLOC_ARENA_MAX: two glibc malloc arenas, not eight per core (the chart sets it too).
ENV PATH=/opt/cachescale/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
# Numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# 8080: the operator's /healthz and /readyz (--health-port); 9090: its /metrics (--metrics-port).
EXPOSE 8080 9090
ENTRYPOINT ["cachescale"]
CMD ["run"]
