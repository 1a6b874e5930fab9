# ON THE DEVICE, sourced by trainer-proof.sh and rl-proof.sh: install what trainer_payload.py
# carried into one folder, the same way for both, and put it on the paths.
#   install_site PAYLOAD_JSON STAGE SITE SCRATCH
# 1. payload_install.py: every file at its sha256, every wheel's files at their RECORD hash, the
#    sglang patch, libnuma (JSON counts on stdout, kept in $OUT/install.json);
# 2. the .pth path lines onto PYTHONPATH: a folder on PYTHONPATH is no site dir, so its .pth files
#    are not read (nvidia_cutlass_dsl.pth: nvidia_cutlass_dsl/python_packages, the `cutlass` DSL);
# 3. the lock's pure-Python sdists (resolution.sdists: antlr4-python3-runtime), then each git
#    source into a folder of its own, merged: pip --target skips a top-level folder that exists
#    already (megatron/ is a namespace that Megatron-LM and Megatron-Bridge share);
# 4. TE's torch extension: the carried wheel of the image (payload_install.py put the image's
#    compiled extension wheels over the lock's) when it loads here, else built from the lock's sdist.
# Sets TE_FROM (where TE's extension came from) and exports PYTHONPATH, LD_LIBRARY_PATH, PATH;
# writes them to SITE/.env.sh too, so that a later call on the same warm machine can use the
# site without installing again (trainer-proof.sh with MTP_REUSE_SITE=1).
install_site() {
    local payload=$1 stage=$2 site=$3 scratch=$4 t0 t1 pth sd src
    t0=$(date +%s)
    rm -rf "$site" "$scratch" && mkdir -p "$site" "$scratch"
    python3 scripts/device/payload_install.py "$payload" "$stage" "$site" | tee "$OUT/install.json"
    pth=$(python3 -c "
import pathlib, sys
site = pathlib.Path(sys.argv[1])
dirs = [site / ln.strip() for p in sorted(site.glob('*.pth')) for ln in p.read_text().splitlines()
        if ln.strip() and not ln.startswith(('#', 'import'))]
print(':'.join(str(d) for d in dirs if d.is_dir()))" "$site")
    export PYTHONPATH=$site${pth:+:$pth} LD_LIBRARY_PATH=$site/_native${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=$site/bin:$PATH
    echo "PYTHONPATH=$PYTHONPATH"
    for sd in "$stage"/*.tar.gz; do
        [ -e "$sd" ] || continue
        case "$(basename "$sd")" in src-*|transformer_engine_torch-*) continue ;; esac
        rm -rf "$scratch/one"
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$scratch/one" "$sd" 2>&1 | tail -3 || true
        cp -r "$scratch/one/." "$site/"
    done
    for src in "$stage"/src-*.tar.gz; do
        [ -e "$src" ] || continue
        rm -rf "$scratch/src" "$scratch/one" && mkdir "$scratch/src" && tar xzf "$src" -C "$scratch/src"
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$scratch/one" "$scratch"/src/* 2>&1 | tail -3 || true
        cp -r "$scratch/one/." "$site/"
    done
    echo "installed in $(( $(date +%s) - t0 )) s"
    t1=$(date +%s)
    TE_FROM=""
    if ls "$stage"/transformer_engine_torch-*.whl >/dev/null 2>&1; then
        if python3 -c "import transformer_engine.pytorch" 2>"$scratch/te.err"; then TE_FROM="the image's compiled wheel"; else tail -3 "$scratch/te.err"; fi
    fi
    if [ -z "$TE_FROM" ]; then
        NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 MAX_JOBS=16 \
            python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$scratch/te-build" \
            "$stage"/transformer_engine_torch-*.tar.gz 2>&1 | tail -3
        cp -r "$scratch/te-build/." "$site/"
        TE_FROM="built here from the lock's sdist"
    fi
    echo "TE torch extension: $TE_FROM ($(( $(date +%s) - t1 )) s)"
    # apex's and flash-attn's compiled modules, where their wheels were carried (else the checks
    # add their named stand-ins)
    for mod in fused_weight_gradient_mlp_cuda flash_attn_2_cuda; do
        python3 -c "import torch, $mod" 2>/dev/null && echo "compiled extension $mod: loads" || echo "compiled extension $mod: absent or does not load"
    done
    printf 'export PYTHONPATH=%q LD_LIBRARY_PATH=%q PATH=%q\nTE_FROM=%q\n' \
        "$PYTHONPATH" "$LD_LIBRARY_PATH" "$PATH" "$TE_FROM" > "$site/.env.sh"
}
