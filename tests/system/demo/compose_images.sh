#!/usr/bin/env bash
# The base images docker-compose.yml needs (python:3.11-slim for the Dockerfile, postgres:16-alpine
# for the database), for machines that cannot reach an image registry.
#
#   tests/system/demo/compose_images.sh          # needs a running dockerd; as root when it builds
#
# For each image, in order:
#   1. present and not one of our stand-ins      -> left alone (a real image: nothing changes);
#   2. `docker pull` succeeds                    -> the real image (replaces an old stand-in);
#   3. our stand-in present, built by this very script with this very CA bundle -> kept (cache);
#   4. otherwise a stand-in is made from Debian bookworm packages with debootstrap (~1 min each)
#      and imported under the real name, labelled org.lockd.standin=<hash of script + CA bundle>.
#
# The python stand-in is Debian's python3 (3.11) with pip, `python` on PATH and pip allowed to
# install into it (as in the official image), plus this machine's CA bundle (the file PIP_CERT
# names) in place of Debian's, because HTTPS here may go through a certificate only that bundle
# trusts; build on the host network so the Dockerfile's `pip install` reaches the package index.
# The postgres stand-in is Debian's postgresql-15 with postgres-entrypoint.sh (POSTGRES_USER,
# POSTGRES_PASSWORD, POSTGRES_DB; initialise once, then serve on 5432; stop signal SIGINT).
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), PIP_CERT (CA bundle);
# COMPOSE_IMAGES_PYTHON / COMPOSE_IMAGES_POSTGRES rename the images (tests of this script only).
# Exit status: 0 when both images are present at the end, 1 otherwise (e.g. no debootstrap).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON_IMAGE="${COMPOSE_IMAGES_PYTHON:-python:3.11-slim}"        # the names: for the script's tests
POSTGRES_IMAGE="${COMPOSE_IMAGES_POSTGRES:-postgres:16-alpine}"
LABEL="org.lockd.standin"

ca_bundle() {
    local f
    for f in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" \
             /etc/ssl/certs/ca-certificates.crt; do
        if [ -n "$f" ] && [ -s "$f" ]; then echo "$f"; return 0; fi
    done
    echo "compose_images: no CA bundle (PIP_CERT)" >&2
    return 1
}
CA="$(ca_bundle)"
STAMP="$(cat "$0" "$HERE/postgres-entrypoint.sh" "$CA" | sha256sum | cut -c1-16)"

log() { echo "compose_images: $*" >&2; }

# label of an image, "" for none, "absent" when the image is not there
standin_label() {
    docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || echo absent
}

WORK=""
cleanup() { if [ -n "$WORK" ]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT

# debootstrap a minimal bookworm with the given packages into $WORK/<name>
bootstrap() {
    local name="$1" include="$2"
    local root="$WORK/$name"
    log "debootstrap $name ($include) from $MIRROR"
    debootstrap --variant=minbase --cache-dir="$WORK/debs" --include="$include" \
        bookworm "$root" "$MIRROR" >"$WORK/$name.log" 2>&1 \
        || { tail -20 "$WORK/$name.log" >&2; return 1; }
    # slim, as the official images are: no package lists, downloaded .debs, docs or translations
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
           "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
           "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
    install -m 0644 "$CA" "$root/etc/ssl/certs/ca-certificates.crt"
}

make_python() {
    local root="$WORK/python"
    bootstrap python python3,python3-pip,python3-venv,python-is-python3,passwd,ca-certificates
    # the official image's pip installs into its Python; Debian marks its Python as apt's (PEP 668)
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    tar -C "$root" -c . | docker import \
        --change "LABEL $LABEL=$STAMP" \
        --change "ENV LANG=C.UTF-8" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change 'CMD ["python3"]' - "$PYTHON_IMAGE" >/dev/null
}

make_postgres() {
    local root="$WORK/postgres" ctx
    bootstrap postgres postgresql-15,passwd,ca-certificates
    # the package made a cluster "main"; the entrypoint makes its own in $PGDATA, as the image does
    rm -rf "$root"/var/lib/postgresql/15 "$root"/etc/postgresql/15
    # no JIT (LLVM is a third of the size): postgres carries on without it when it cannot load it
    rm -rf "$root"/usr/lib/postgresql/15/lib/llvmjit* "$root"/usr/lib/postgresql/15/lib/bitcode \
           "$root"/usr/lib/*-linux-gnu/libLLVM*
    install -m 0755 "$HERE/postgres-entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
    tar -C "$root" -c . | docker import - "$POSTGRES_IMAGE-rootfs" >/dev/null
    # STOPSIGNAL cannot be set by `docker import`: one metadata-only build step on top
    ctx="$WORK/postgres-build"; mkdir -p "$ctx"
    cat >"$ctx/Dockerfile" <<EOF
FROM $POSTGRES_IMAGE-rootfs
LABEL $LABEL=$STAMP
ENV LANG=C.UTF-8 PGDATA=/var/lib/postgresql/data \
    PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
VOLUME /var/lib/postgresql/data
ENTRYPOINT ["docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
EOF
    DOCKER_BUILDKIT=0 docker build -q -t "$POSTGRES_IMAGE" "$ctx" >/dev/null 2>"$WORK/postgres-build.log" \
        || { cat "$WORK/postgres-build.log" >&2; return 1; }
    docker rmi "$POSTGRES_IMAGE-rootfs" >/dev/null
}

ensure() {
    local image="$1" maker="$2" label started
    label="$(standin_label "$image")"
    if [ "$label" != absent ] && [ -z "$label" ]; then
        log "$image: present (not a stand-in), left alone"; return 0
    fi
    if docker pull -q "$image" >/dev/null 2>&1; then
        log "$image: pulled"; return 0
    fi
    if [ "$label" = "$STAMP" ]; then
        log "$image: stand-in cached (no registry reachable)"; return 0
    fi
    command -v debootstrap >/dev/null || { log "$image: cannot be pulled, and debootstrap is not installed (make system-deps)"; return 1; }
    if [ -z "$WORK" ]; then
        WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/lockd-standin.XXXXXX")"; mkdir "$WORK/debs"
    fi
    started=$SECONDS
    log "$image: no registry reachable; building a stand-in from Debian packages"
    "$maker"
    log "$image: stand-in built in $((SECONDS - started)) s"
}

ensure "$PYTHON_IMAGE" make_python
ensure "$POSTGRES_IMAGE" make_postgres
