#include "dist_rank.hpp"
namespace bpt {
int run_ddp(const std::vector<std::string>&) {
  return 2;
}
}  // namespace bpt
