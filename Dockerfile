# Backstop container image: build with the Swift toolchain, run on a slim Debian with libcurl only.
#   docker build -t backstop .
# Sidecar (the usual use): run it in the application's network namespace and give the app
# HTTP_PROXY=http://127.0.0.1:8080; the config's listener stays on loopback:
#   docker run -d --network container:APP -v /srv/backstop:/etc/backstop -v backstop-state:/var/lib/backstop backstop
# Publishing the port instead (-p 8080:8080) needs a non-loopback listener with allow_remote/allow_clients
# (docs/operations.md, "Docker and sidecars").

FROM swift:6.3-bookworm AS build
# binutils: `install -s` strips with its strip.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libcurl4-openssl-dev binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Package.resolved pins dependency versions when present (it is git-ignored, so a clean clone has none: the
# [d] glob lets COPY go on without it). Tests/ only because the manifest declares test targets.
COPY Package.swift Package.resolve[d] ./
COPY Sources ./Sources
COPY Tests ./Tests
COPY scripts/build-release.sh ./scripts/
# The image gets a stripped binary (about half the size: no debug info or symbol table); build with
# --build-arg KEEP_SYMBOLS=1 for one that keeps them, to read a backtrace (docs/operations.md, "Installing").
ARG KEEP_SYMBOLS=0
RUN bash scripts/build-release.sh --product backstop \
    && install -D -m 0755 $([ "$KEEP_SYMBOLS" = 1 ] || echo -s) "$(bash scripts/build-release.sh --show-bin-path)/backstop" /out/backstop

FROM debian:bookworm-slim
# Exactly what the binary links dynamically besides glibc (checked by scripts/check-runtime-deps.sh), and two data
# packages: the CA certificates, and the Public Suffix List that `check` reads when an upstream intercepts.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libcurl4 ca-certificates publicsuffix \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 backstop \
    && useradd --system --uid 10001 --gid backstop --home-dir /var/lib/backstop --shell /usr/sbin/nologin backstop \
    && install -d -o backstop -g backstop -m 0700 /var/lib/backstop \
    && install -d -m 0755 /etc/backstop
COPY --from=build /out/backstop /usr/local/bin/backstop
USER backstop
VOLUME ["/etc/backstop", "/var/lib/backstop"]
EXPOSE 8080 9901
# No curl in the runtime image: bash's /dev/tcp sends GET /healthz to the admin listener (keep admin.listen at
# 127.0.0.1:9901) and the status line must say 200. Checked against the daemon with /bin/sh = dash.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD bash -c 'exec 3<>/dev/tcp/127.0.0.1/9901 && printf "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n" >&3 && IFS= read -r status <&3 && [[ "$status" == "HTTP/1."?" 200 "* ]]'
ENTRYPOINT ["/usr/local/bin/backstop"]
CMD ["run", "--config", "/etc/backstop/backstop.yaml"]
