# The SMon server image: the package (agent, server, migrations) with its server extra, run as a
# non-root user. `smon server` applies migrations at start; set SMON_AUTO_MIGRATE=false where a
# separate job does it (deploy/kubernetes runs `smon db upgrade` as a Job before the rollout).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY server ./server
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/smon-*.whl)[server]" \
    && rm -rf /wheels \
    && useradd --create-home --uid 10001 smon
USER 10001
WORKDIR /home/smon
ENV PYTHONUNBUFFERED=1 \
    SMON_HTTP_PORT=8080 \
    SMON_GRPC_PORT=50051
EXPOSE 8080 50051
HEALTHCHECK --interval=15s --timeout=3s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["smon", "server"]
