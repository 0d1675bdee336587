# Shared by the GPU machine's scripts (run_gpu.sh, run_gpu2.sh, run_gpu_pair.sh), which
# source it: the carried wheels' install, and stages with time caps inside a deadline.

install_carried_wheels() {  # the peers' wheels carried in .whl, into /tmp/site
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/site .whl/*.whl || exit 1
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
