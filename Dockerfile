# Talkstream server image.
#   CPU (default):  docker build -t talkstream .
#   CUDA:           docker build -t talkstream:cuda \
#                     --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#                   docker run --gpus all -p 8000:8000 talkstream:cuda
# A non-Python base (the CUDA one) gets Python from the distribution's packages. NATIVE_KERNELS=1 (default) adds a
# C compiler so the codec's CPU kernels are built (about 1.6x faster codec on the CPU); 0 keeps the image smaller.
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG NATIVE_KERNELS=1
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TALKSTREAM_CACHE_DIR=/var/cache/talkstream

RUN packages=""; \
    command -v python3 >/dev/null || packages="python3 python3-venv"; \
    [ "$NATIVE_KERNELS" = 1 ] && packages="$packages gcc libc6-dev"; \
    if [ -n "$packages" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $packages && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv "$VIRTUAL_ENV"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY talker ./talker
COPY output_builder ./output_builder
COPY server ./server
RUN pip install --index-url "$TORCH_INDEX" "torch==2.13.0" \
    && pip install .

RUN useradd --create-home --uid 10001 talkstream \
    && mkdir -p "$TALKSTREAM_CACHE_DIR" && chown talkstream "$TALKSTREAM_CACHE_DIR"
USER talkstream
ENV TALKSTREAM_NATIVE_KERNELS=${NATIVE_KERNELS}
# Build the codec kernels now rather than on first start (a no-op without a compiler).
RUN python3 -c "from pathlib import Path; from output_builder.codecs.native import load_native; \
load_native(Path('$TALKSTREAM_CACHE_DIR'))"
# The embedded tiny checkpoint is generated into the cache on first start. A real model: --build-arg MODEL=HUB_ID
# puts it into the image's Hugging Face cache now (then `serve --model HUB_ID` starts offline); or mount a Hub cache
# at /home/talkstream/.cache/huggingface, or a model directory and pass `--model /models/NAME`.
ARG MODEL=""
RUN if [ -n "$MODEL" ]; then talkstream download "$MODEL"; fi

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD python3 -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"
ENTRYPOINT ["talkstream"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
