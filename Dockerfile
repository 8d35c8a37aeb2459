# One image for both halves of Shale on Kubernetes (helm/shale): the storage nodes run
# `shale serve ...` and the operator runs `shale operator`. Build from the repository root:
#   docker build -t shale:0.1.0 .
# The chart runs it as user 10001 with a read-only root filesystem (writable: the data volume, /tmp).

# Build stage: the wheels, with a C compiler for the log engine's loops and the codec's interpreter
# (sidecar/log/_cleaner_kernel.c, _append_kernel.c, _columns_kernel.c, sidecar/protocol/_codec_kernel.c).
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Run stage: no compiler, no build files; only the installed project and its pinned dependencies.
FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin shale
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels shale \
    && rm -rf /wheels \
    && shale --help >/dev/null
# Python writes no .pyc files (the root filesystem is read-only in the cluster) and logs unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# Kafka (9092) and HTTP (8080) of `shale serve`; the operator's /healthz (8081) and /metrics (8082).
EXPOSE 9092 9093 9094 8080 8081 8082
ENTRYPOINT ["shale"]
CMD ["--help"]
