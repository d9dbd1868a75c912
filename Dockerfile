# The project image: lockd, resource-proxy, lockctl and the demo (python -m lockd.demo).
#   docker build -t lockd .
#   docker run --rm -p 7070:7070 lockd                      # lockd serve (embedded SQLite store)
# docker-compose.yml runs the revived-holder demo against PostgreSQL with this image;
# tests/system/demo/test_compose_real.py builds it and runs that demo for real.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# Unprivileged user; its home holds the embedded store and lockd's signing keys by default.
RUN useradd --create-home --home-dir /var/lib/lockd --shell /usr/sbin/nologin lockd

# No WORKDIR for the build: the daemon would make it again (empty) in every later layer.
# The dependencies first, from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml /src/
RUN python -c "import tomllib; print(*tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md /src/
COPY lockd /src/lockd
COPY resource_proxy /src/resource_proxy
RUN pip install --no-deps /src && rm -rf /src

USER lockd
WORKDIR /var/lib/lockd

EXPOSE 7070 7071
CMD ["lockd", "serve", "--host", "0.0.0.0", "--port", "7070"]
