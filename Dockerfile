# Tether with its server and PostgreSQL extras, and the application in deploy/app.py, run as a
# user without privileges. One image for every role: `tether worker`, `tether serve`,
# `tether migrate` (compose.yaml, deploy/kubernetes.yaml, docs/deploy.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[server,postgres]" && rm -rf /src

# Your application: replace deploy/app.py (or COPY your package here and name it MODULE:APP).
WORKDIR /app
COPY deploy/app.py ./app.py
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin tether
USER 10001

# Probes: `tether serve` answers /healthz and /readyz on its port; `tether worker` on
# --health-port. SIGTERM lets in-flight steps finish (see docs/deploy.md on drain).
STOPSIGNAL SIGTERM
EXPOSE 8000 8001
CMD ["tether", "worker", "app:app", "--health-port", "8001", "--health-host", "0.0.0.0"]
