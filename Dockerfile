# The CEP services (splitter, workers, coordinator, API) and the cep CLI, installed from the
# built wheel with the core dependencies only (no Spark, no JRE, no matplotlib; the
# backfill and the FPGA plots are the [spark] and [fpga] extras). The image runs as the
# unprivileged user `cep` (uid 10001), which owns the kernel cache and the state folder.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cep_core cep_core
COPY services services
COPY accel accel
COPY bench bench
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The service user, with a home; numeric ids so that runAsNonRoot checks can verify it.
RUN groupadd --system --gid 10001 cep \
    && useradd --system --uid 10001 --gid cep --create-home --home-dir /home/cep \
       --shell /usr/sbin/nologin cep
WORKDIR /app
COPY examples examples
# User stream schemas: mount a folder of <stream>.json files at /etc/cep/schemas. Kernels
# (generated modules and numba's machine code): /var/cache/cep/kernels, a named volume in
# docker-compose.yml shared by every service, so a kernel is compiled once, not at every
# container start (docs/deploy.md).
ENV CEP_KERNEL_CACHE=/var/cache/cep/kernels CEP_HOME=/var/lib/cep \
    CEP_SCHEMA_PATH=/etc/cep/schemas HOME=/home/cep
# The example queries of each stream, /app/queries/<stream>.cep: what the compose `queries`
# service registers for CEP_STREAM.
COPY docker/stream_queries.py /tmp/stream_queries.py
RUN mkdir -p /etc/cep/schemas /var/cache/cep/kernels /var/lib/cep \
    && python /tmp/stream_queries.py /app/queries --schema examples/own_stream/schemas \
       examples/*.cep examples/own_stream/*.cep \
    && rm /tmp/stream_queries.py \
    && chown -R cep:cep /var/cache/cep /var/lib/cep
USER 10001:10001
ENTRYPOINT ["cep"]
