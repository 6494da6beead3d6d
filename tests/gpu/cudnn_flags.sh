# Sourced by the tests/gpu/ build scripts: cuDNN's fused attention (kernels/cuda/attention_cudnn.cu,
# the executor's attention = cudnn | auto) needs the header-only cuDNN frontend, carried to the GPU
# host in .carry-cudnn-frontend/include (git-ignored; CUDNN_FE overrides). Without it
# attention_cudnn.cu builds as a stub that says so and the executor has only our attention.
# Sets CUDNN_FLAGS (for nvcc on attention_cudnn.cu) and CUDNN_LIBS (for the link).
CUDNN_FE=${CUDNN_FE:-$PWD/.carry-cudnn-frontend/include}
if [ -f "$CUDNN_FE/cudnn_frontend.h" ]; then
  CUDNN_FLAGS=(-DTOPOLAUNCH_WITH_CUDNN=1 -DCUDNN_FRONTEND_SKIP_JSON_LIB -isystem "$CUDNN_FE")
  CUDNN_LIBS=(-lcudnn -lnvrtc)
  echo "cuDNN attention: built with the frontend in $CUDNN_FE"
else
  CUDNN_FLAGS=()
  CUDNN_LIBS=()
  echo "cuDNN attention: NOT built ($CUDNN_FE/cudnn_frontend.h absent: carry .carry-cudnn-frontend)"
fi
