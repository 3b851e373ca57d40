# The SMon server image: the package (agent, server, migrations, the built dashboard) with its
# server extra, run as a non-root user. `smon server` applies migrations at start; set SMON_AUTO_MIGRATE=false where a
# separate job does it (deploy/kubernetes runs `smon db upgrade` as a Job before the rollout).
FROM node:20-slim AS web
WORKDIR /src/web
COPY web/package.json web/package-lock.json ./
COPY web/api-types/package.json ./api-types/
RUN npm ci --no-audit --no-fund
COPY web ./
# Vite writes the build into the server package (../server/smon_server/dashboard/dist).
RUN mkdir -p ../server/smon_server/dashboard && npm run build

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY agent ./agent
COPY server ./server
COPY migrations ./migrations
COPY --from=web /src/server/smon_server/dashboard/dist ./server/smon_server/dashboard/dist
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
