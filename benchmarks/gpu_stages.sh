# Shared by the GPU machine's scripts (run_gpu.sh, run_gpu2.sh, run_gpu_pair.sh,
# run_gpu_titan.sh), which source it: the carried wheels' install (torchtitan's apart), and
# stages with time caps inside a deadline.

install_wheels() {  # install_wheels FOLDER TARGET: FOLDER's wheels into TARGET, if any;
    # false where there are none
    compgen -G "$1/*.whl" >/dev/null || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$2" "$1"/*.whl || exit 1
}

install_carried_wheels() {  # the peers' wheels carried in .whl, into /tmp/site
    install_wheels .whl /tmp/site || true
}

install_titan_wheels() {  # torchtitan carried in .whl/titan, into /tmp/titan, on PYTHONPATH
    # (benchmarks/titan_wheels.txt), and the datasets stand-in where the machine has none
    if install_wheels .whl/titan /tmp/titan; then
        export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/titan
    fi
    if ! python3 -c "import datasets" 2>/dev/null; then
        export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/benchmarks/stand_ins
    fi
}

# `stage` reads DEADLINE (seconds from the script's start) and SUMMARY (a file), and sets
# status to 1 where a stage fails: the sourcing script sets all three first.

cap() {  # the seconds a stage may take: at most $1, and no later than DEADLINE
    local left=$((DEADLINE - SECONDS))
    echo $((left < $1 ? (left > 1 ? left : 1) : $1))
}

stage() {  # stage NAME LOG CAP COMMAND...: run under `timeout`, log, one summary line
    local name=$1 log=$2 limit
    limit=$(cap "$3")
    shift 3
    local started=$SECONDS
    echo "=== $name (cap ${limit} s): $*" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    local code=$?
    echo "$name: exit $code after $((SECONDS - started)) s" | tee -a "$SUMMARY"
    [ "$code" = 0 ] || status=1
    return "$code"
}
