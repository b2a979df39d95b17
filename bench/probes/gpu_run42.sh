# The cuda suite (two shards) and the fuzzer at two new seeds on torch's cuDNN 9.19, in parallel on one GPU until
# the time is up (gpu_run40.sh on 9.19). carry .whl.   $1 = first seed (the second is $1+2), $2 = seconds
exec bash bench/probes/gpu_run40.sh "${1:-9107}" "${2:-500}" 919
