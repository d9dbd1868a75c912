# The project image: lockd, resource-proxy, lockctl and the demo (python -m lockd.demo).
#   docker build -t lockd .
#   docker run --rm -p 7070:7070 lockd                      # lockd serve (embedded SQLite store)
# docker-compose.yml runs the revived-holder demo against PostgreSQL with this image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY lockd ./lockd
COPY resource_proxy ./resource_proxy
RUN pip install . && rm -rf /src

# Unprivileged user; its home holds the embedded store and lockd's signing keys by default.
RUN useradd --create-home --home-dir /var/lib/lockd --shell /usr/sbin/nologin lockd
USER lockd
WORKDIR /var/lib/lockd

EXPOSE 7070 7071
CMD ["lockd", "serve", "--host", "0.0.0.0", "--port", "7070"]
