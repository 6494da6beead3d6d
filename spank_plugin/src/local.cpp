// srun (S_CTX_LOCAL): option values were validated by their callbacks, so srun has already
// stopped with "Invalid --topolaunch argument" on a bad one. Here only what needs all options.
#include <fmt/format.h>

#include "spank.hpp"

namespace topolaunch::spank {

int local_init_post_opt(spank_t) {
  const auto& s = state();
  if (s.options.config_path && !s.site.allow_user_config) {
    log_error("--topolaunch-config: this site does not accept job configs (allow_user_config=0)");
    return -1;
  }
  return 0;
}

}  // namespace topolaunch::spank
