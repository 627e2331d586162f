# Talkstream server image.
#   CPU (default):  docker build -t talkstream .
#   CUDA:           docker build -t talkstream:cuda \
#                     --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#                   docker run --gpus all -p 8000:8000 talkstream:cuda
#   Ray Serve:      --build-arg EXTRAS=ray (README: Scaling out on Ray Serve; deploy/kuberay/rayservice.yaml)
# A non-Python base (the CUDA one) gets Python from the distribution's packages. The first stage builds the wheel,
# whose native CPU kernels (the codec's and the sampler's, setup.py) are compiled there. The image itself carries g++
# for torch.compile (--compile, talker/compiled.py): on a CPU, Inductor compiles the decode step's C++ kernels at the
# first start and caches them under TALKSTREAM_CACHE_DIR (mount a volume there to keep them across containers).
ARG BASE=python:3.11-slim

FROM ${BASE} AS wheel
RUN packages="gcc libc6-dev"; \
    command -v python3 >/dev/null || packages="$packages python3 python3-venv"; \
    apt-get update && apt-get install -y --no-install-recommends $packages && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/build && /opt/build/bin/pip install --no-cache-dir "setuptools>=68" wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY common ./common
COPY talker ./talker
COPY frontend ./frontend
COPY output_builder ./output_builder
COPY engine ./engine
COPY server ./server
COPY benchmarks ./benchmarks
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation -w /wheels .

FROM ${BASE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TALKSTREAM_CACHE_DIR=/var/cache/talkstream

# EXTRAS=ray: the Ray Serve extra (talkstream serve --ray, deploy/kuberay), and wget, which KubeRay's probes call
ARG EXTRAS=""
RUN packages="g++"; \
    command -v python3 >/dev/null || packages="$packages python3 python3-venv"; \
    [ -z "$EXTRAS" ] || packages="$packages wget"; \
    apt-get update && apt-get install -y --no-install-recommends $packages && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

COPY --from=wheel /wheels /wheels
RUN pip install --index-url "$TORCH_INDEX" "torch==2.13.0" \
    && pip install "$(echo /wheels/*.whl)${EXTRAS:+[$EXTRAS]}" "torch==2.13.0" && rm -rf /wheels \
    && python3 -c "from output_builder.codecs.native import load_native; from talker.sampler_native import \
load_sampling_kernel; assert load_native() and load_sampling_kernel(), 'the wheel has no native kernels'"

RUN useradd --create-home --uid 10001 talkstream \
    && mkdir -p "$TALKSTREAM_CACHE_DIR" && chown talkstream "$TALKSTREAM_CACHE_DIR"
USER talkstream
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
