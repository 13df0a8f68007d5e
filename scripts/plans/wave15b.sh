# Wave 15, second part (issue 34): after wave15.sh's ro1 failed on the GPU ("accessing tensor output of CUDAGraphs that
# has been overwritten by a subsequent run": the first micro-step's gradients lived in the graphs' buffers), the same
# benches with the fix (grads_out_of_cudagraph_pool). Started in the same OUT_DIR once wave15.sh's phases are done:
#   setsid bash -c 'until grep -q "all phases done" /tmp/w15/progress; do sleep 5; done; \
#       scripts/lease.sh /tmp/w15 scripts/plans/wave15b.sh' > /tmp/w15b.log 2>&1 < /dev/null &
# shellcheck shell=bash disable=SC2086,SC2154
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
R32="--data.seq_len=32768 --train.stages=$S32"
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
RO="--ab=--train.compile_mode=reduce-overhead"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
phase ro1-fix 600 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32 $RO \
    && [ "$NG" -ge 2 ] \
    && phase multi-ro 600 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32 $RO
true
