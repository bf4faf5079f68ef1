# The CEP services (splitter, workers, coordinator) and the cep CLI, installed from the
# built wheel with the core dependencies only (no Spark, no JRE, no matplotlib; the
# backfill and the FPGA plots are the [spark] and [fpga] extras).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cep_core cep_core
COPY services services
COPY accel accel
COPY bench bench
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY examples examples
# User stream schemas: mount a folder of <stream>.json files here (docs/deploy.md).
ENV CEP_KERNEL_CACHE=/var/cache/cep/kernels CEP_HOME=/var/lib/cep \
    CEP_SCHEMA_PATH=/etc/cep/schemas
RUN mkdir -p /etc/cep/schemas /var/cache/cep/kernels /var/lib/cep
ENTRYPOINT ["cep"]
