// The model the checkpoint harness loads against, and its seeds are written for: an MLP small
// enough that a whole checkpoint is a few hundred bytes (fuzzing speed), with every entry kind
// (parameters, grad_norm, AdamW's m and v).
#pragma once

#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::fuzz {

inline kernels::Graph tiny_training_graph() {
  kernels::MlpConfig c;
  c.vocab_size = 3;
  c.n_embd = 2;
  c.hidden = {2};
  c.batch = 1;
  c.seq_len = 2;
  kernels::Graph g = kernels::build_mlp(c);
  kernels::append_backward(g);
  kernels::append_optimizer(g);
  return g;
}

}  // namespace topolaunch::fuzz
