// One optimizer step's hyper-parameters, as every backend takes them (the graph's adamw and
// global_norm ops: append_optimizer in graph.hpp). Here, on the compiler floor, so that a backend
// needs no other backend's header for them.
#pragma once

namespace topolaunch::kernels {

struct AdamWSettings {
  double learning_rate = 1e-3, beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

}  // namespace topolaunch::kernels
