# Wave 15, third part (issue 34): the machine of wave15.sh went back while the gradient fix was written (a call gap
# over 30 s), so what the budget left (~14 device-minutes) runs here on a fresh machine: the CUDA-graph gradient
# check beside the trainer's bench with train.compile_mode=reduce-overhead (rows of 1 x 32,768), then the same bench on
# every GPU.  setsid scripts/lease.sh /tmp/w16 scripts/plans/wave15c.sh > /tmp/w16.log 2>&1 < /dev/null &
# shellcheck shell=bash disable=SC2086,SC2154
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
R32="--data.seq_len=32768 --train.stages=$S32"
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
RO="--ab=--train.compile_mode=reduce-overhead"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
[ "$NG" -ge 2 ] && ( phase cudagraphs 480 env CUDA_VISIBLE_DEVICES=1 $PY scripts/gpu_check_cudagraphs.py \
    --preset speedrun-latest --step 20 --rows 1 --seq-len 16384 --micro-steps 8 --steps 6 ) &
phase ro1-fix 600 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32 $RO
RO1=$?
wait
[ "$NG" -ge 2 ] && [ "$RO1" -eq 0 ] && phase multi-ro 600 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" \
    $R32 $RO
true
