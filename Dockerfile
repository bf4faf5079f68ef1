# The CEP services (splitter, workers, coordinator) and the cep CLI.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cep_core cep_core
COPY services services
COPY accel accel
COPY schemas schemas
COPY examples examples
RUN pip install --no-cache-dir .
ENV CEP_KERNEL_CACHE=/var/cache/cep/kernels
ENTRYPOINT ["cep"]
