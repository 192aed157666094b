# One image for every delayed-retry command: the entry point is the command line.
#
#   docker build -t delayed-retry .
#   docker run --rm delayed-retry --url amqp://guest:guest@broker:5672/ forwarder \
#       --exchange orders --health-port 8081 --metrics-port 9464
#
# BASE_IMAGE: any image with Python 3.11+ and its venv module (python:3.11-slim by
# default; the tests build one from Debian's packages, since no registry is reachable
# there). PIP_INSTALL_OPTIONS: extra pip options, e.g. "--no-index --find-links
# /src/wheels" to install from wheels put in the build context.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG PIP_INSTALL_OPTIONS=""
ARG EXTRAS=service,webhook,web
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/delayed-retry/bin:$PATH \
    XDG_STATE_HOME=/var/lib/delayed-retry

COPY . /src
RUN python3 -m venv /opt/delayed-retry \
    && /opt/delayed-retry/bin/pip install --no-cache-dir ${PIP_INSTALL_OPTIONS} "/src[${EXTRAS}]" \
    && rm -rf /src \
    && useradd --system --no-create-home --shell /usr/sbin/nologin delayed-retry \
    && install -d -o delayed-retry -g delayed-retry /var/lib/delayed-retry
USER delayed-retry
WORKDIR /tmp

# State (the web view's audit log): mount a volume here to keep it across containers.
VOLUME /var/lib/delayed-retry
# Health (--health-port) and metrics (--metrics-port) ports used by deploy/.
EXPOSE 8081 9464
ENTRYPOINT ["delayed-retry"]
CMD ["--help"]
