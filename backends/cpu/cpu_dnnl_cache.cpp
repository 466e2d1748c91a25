// The oneDNN engine, per-thread streams and the primitive cache of Note [CPU primitive cache].
#include "cpu_dnnl_cache.hpp"

#include <algorithm>
#include <list>
#include <unordered_map>
#include <utility>

namespace bp::cpu {
namespace {

struct Entry {
  std::once_flag once;
  DnnlPrimitive value;
};

class Cache {
 public:
  std::shared_ptr<const DnnlPrimitive> get(const std::string& key,
                                           const std::function<DnnlPrimitive()>& make) {
    std::shared_ptr<Entry> e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(key);
      if (it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
        e = it->second->second;
      } else {
        e = std::make_shared<Entry>();
        lru_.emplace_front(key, e);
        index_.emplace(key, lru_.begin());
        if (lru_.size() > kDnnlCacheCapacity) {
          index_.erase(lru_.back().first);
          lru_.pop_back();
        }
      }
    }
    std::call_once(e->once, [&] { e->value = make(); });
    return {e, &e->value};  // aliasing: keeps the entry alive
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return lru_.size();
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<Entry>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: kernels may run during static destruction
  return *c;
}

}  // namespace

dnnl::engine& dnnl_engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream s(dnnl_engine());
  return s;
}

std::shared_ptr<const DnnlPrimitive> dnnl_cached(const std::string& key, int threads,
                                                 const std::function<DnnlPrimitive()>& make) {
  threads = std::max(threads, 1);
  return cache().get(key + " t" + std::to_string(threads), [&] {
    OmpThreads omp(threads);
    DnnlPrimitive p = make();
    p.threads = threads;
    return p;
  });
}

dnnl::memory dnnl_mem(const dnnl::memory::desc& md, const void* p) {
  return dnnl::memory(md, dnnl_engine(), const_cast<void*>(p));
}

void dnnl_run(const DnnlPrimitive& p, std::unordered_map<int, dnnl::memory>& args) {
  OmpThreads threads(p.threads);
  AlignedBuffer scratch(p.scratchpad.get_size());
  args.insert_or_assign(DNNL_ARG_SCRATCHPAD, dnnl_mem(p.scratchpad, scratch.get()));
  p.prim.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

size_t dnnl_cache_size() {
  return cache().size();
}

}  // namespace bp::cpu
