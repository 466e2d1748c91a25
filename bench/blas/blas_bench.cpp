// bp-blas-bench: the BLAS candidates for the CPU backend side by side (backends/cpu/README.md,
// "Choosing the matrix-product library").
//
//   bp-blas-bench [--threads N] [--quick] [CANDIDATE ...]
//   CANDIDATE = name=kind:/path/to/library.so     kind: openblas | blis | dnnl
//
// Without candidates it measures the ones CMake found on this machine. Each candidate is
// opened with dlopen in a child process of its own (their thread pools never meet, and two
// builds of one library with the same symbol names can be compared), so the program links no
// BLAS and runs on any machine that has the library files.
//
// For f32 products 1024^3 and 2048^3 (A*B, row-major) and the MLP-shaped 256x1024x1024
// x*W^T (B transposed, as nn::Linear multiplies) it reports GFLOP/s (median of repeated calls
// after a warm-up) in these modes:
//   1 thread        the library with one thread
//   lib N threads   the library's own threading with N threads
//   tbb tiles       one-threaded library calls on 2-D output tiles spread by oneTBB over N
//                   workers (how the cpu backend used OpenBLAS before)
// and the cooperation case: H host threads (2 and 4) issuing 1024^3 products at once,
// aggregate GFLOP/s, when each call asks the library for all N threads ("lib N each"), when
// the N threads are split between the callers ("lib N/H each"), and as tbb tiles in oneTBB's
// one shared pool. Oversubscription shows as an aggregate far below the one-caller figure.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tbb/blocked_range2d.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// Row-major sgemm: C[m,n] = A[m,k] * op(B), op(B) = B[k,n] or B[n,k]^T when tb.
using Sgemm = void (*)(bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c, int64_t ldc);
using SetThreads = void (*)(int n);

// The library being measured in this (child) process.
struct Lib {
  std::string name, kind, info;
  void* handle = nullptr;
  Sgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
};
Lib g_lib;

// cblas entry points (OpenBLAS, BLIS)
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
CblasSgemm g_cblas = nullptr;
void cblas_call(bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, float* c, int64_t ldc) {
  g_cblas(kRowMajor, kNoTrans, tb ? kTrans : kNoTrans, int(m), int(n), int(k), 1.0f, a, int(lda), b,
          int(ldb), 0.0f, c, int(ldc));
}
// oneDNN's dnnl_sgemm is row-major too.
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
DnnlSgemm g_dnnl = nullptr;
void dnnl_call(bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float* c, int64_t ldc) {
  g_dnnl('N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
// Thread setters: each library's own global, or OpenMP's per-calling-thread ICV for oneDNN.
void (*g_set_int)(int) = nullptr;
void (*g_set_i64)(int64_t) = nullptr;  // BLIS: bli_thread_set_num_threads(dim_t)
void set_int(int n) {
  g_set_int(n);
}
void set_i64(int n) {
  g_set_i64(n);
}

template <class F>
F sym(const char* name) {
  void* p = dlsym(g_lib.handle, name);
  if (!p) {
    std::fprintf(stderr, "%s: %s has no symbol %s\n", g_lib.name.c_str(), g_lib.kind.c_str(), name);
    std::exit(3);
  }
  return reinterpret_cast<F>(p);
}

void open_lib(const std::string& spec) {
  const size_t eq = spec.find('='), colon = spec.find(':', eq + 1);
  if (eq == std::string::npos || colon == std::string::npos) {
    std::fprintf(stderr, "bad candidate '%s' (want name=kind:path)\n", spec.c_str());
    std::exit(2);
  }
  g_lib.name = spec.substr(0, eq);
  g_lib.kind = spec.substr(eq + 1, colon - eq - 1);
  const std::string path = spec.substr(colon + 1);
  g_lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!g_lib.handle) {
    std::fprintf(stderr, "%s: cannot open %s: %s\n", g_lib.name.c_str(), path.c_str(), dlerror());
    std::exit(3);
  }
  if (g_lib.kind == "openblas") {
    g_cblas = sym<CblasSgemm>("cblas_sgemm");
    g_set_int = sym<void (*)(int)>("openblas_set_num_threads");
    g_lib.sgemm = cblas_call;
    g_lib.set_threads = set_int;
    g_lib.info = sym<char* (*)()>("openblas_get_config")();
    g_lib.info += std::string(" core ") + sym<char* (*)()>("openblas_get_corename")();
  } else if (g_lib.kind == "blis") {
    g_cblas = sym<CblasSgemm>("cblas_sgemm");
    g_set_i64 = sym<void (*)(int64_t)>("bli_thread_set_num_threads");
    g_lib.sgemm = cblas_call;
    g_lib.set_threads = set_i64;
    const int arch = sym<int (*)()>("bli_arch_query_id")();
    g_lib.info = std::string("BLIS ") + sym<const char* (*)()>("bli_info_get_version_str")() +
                 " arch " + sym<const char* (*)(int)>("bli_arch_string")(arch);
  } else if (g_lib.kind == "dnnl") {
    g_dnnl = sym<DnnlSgemm>("dnnl_sgemm");
    g_set_int = sym<void (*)(int)>("omp_set_num_threads");
    g_lib.sgemm = dnnl_call;
    g_lib.set_threads = set_int;
    struct Version {
      int major, minor, patch;
      const char* hash;
      unsigned cpu_runtime, gpu_runtime;
    };
    const Version* v = sym<const Version* (*)()>("dnnl_version")();
    g_lib.info = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                 std::to_string(v->patch) + " (OpenMP runtime)";
  } else {
    std::fprintf(stderr, "unknown kind '%s' (openblas, blis, dnnl)\n", g_lib.kind.c_str());
    std::exit(2);
  }
}

struct Shape {
  const char* name;
  int64_t m, n, k;
  bool tb;
};

struct Operands {
  std::vector<float> a, b, c;
  explicit Operands(const Shape& s) : a(s.m * s.k), b(s.k * s.n), c(s.m * s.n) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
  }
  void call(const Shape& s) {
    g_lib.sgemm(s.tb, s.m, s.n, s.k, a.data(), s.k, b.data(), s.tb ? s.k : s.n, c.data(), s.n);
  }
};

// One product as one-threaded calls on 2-D output tiles of at least 128 a side, spread over
// oneTBB's workers (the cpu backend's earlier scheme, Note [One thread pool]).
void tiles_call(Operands& o, const Shape& s, int workers) {
  int64_t tm = s.m, tn = s.n;
  auto tiles = [&] { return ((s.m + tm - 1) / tm) * ((s.n + tn - 1) / tn); };
  while (tiles() < workers && std::max(tm, tn) >= 256)
    (tm >= tn ? tm : tn) = (std::max(tm, tn) + 1) / 2;
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, s.m, tm, 0, s.n, tn),
                    [&](const tbb::blocked_range2d<int64_t>& r) {
                      const int64_t i0 = r.rows().begin(), j0 = r.cols().begin();
                      const float* b = s.tb ? o.b.data() + j0 * s.k : o.b.data() + j0;
                      g_lib.sgemm(s.tb, int64_t(r.rows().size()), int64_t(r.cols().size()), s.k,
                                  o.a.data() + i0 * s.k, s.k, b, s.tb ? s.k : s.n,
                                  o.c.data() + i0 * s.n + j0, s.n);
                    });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool g_quick = false;

// GFLOP/s of fn: median of calls after two warm-ups, at least 3 calls and ~0.3 s (0.1 quick).
template <class F>
double gflops(const Shape& s, F&& fn) {
  fn();
  fn();
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  const double budget = g_quick ? 0.1 : 0.3;
  while (t.size() < 3 || (seconds_since(start) < budget && t.size() < 200)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return 2.0 * s.m * s.n * s.k / t[t.size() / 2] / 1e9;
}

// Aggregate GFLOP/s of `callers` host threads each running `per` products at once.
template <class F>
double gflops_concurrent(const Shape& s, int callers, F&& one_caller) {
  const int per = g_quick ? 4 : 12;
  std::vector<Operands> ops;
  for (int h = 0; h < callers; ++h) ops.emplace_back(s);
  for (int h = 0; h < callers; ++h) one_caller(ops[h], 1);  // warm-up, one each in turn
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int h = 0; h < callers; ++h)
    threads.emplace_back([&, h] {
      ready.fetch_add(1);
      while (ready.load() < callers) {
      }
      one_caller(ops[h], per);
    });
  for (auto& t : threads) t.join();
  return 2.0 * s.m * s.n * s.k * callers * per / seconds_since(t0) / 1e9;
}

bool check_correct() {
  const Shape s{"check", 67, 45, 93, true};
  Operands o(s);
  g_lib.set_threads(1);
  o.call(s);
  double worst = 0;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < s.k; ++p) ref += double(o.a[i * s.k + p]) * o.b[j * s.k + p];
      worst = std::max(worst, std::fabs(ref - o.c[i * s.n + j]));
    }
  return worst < 1e-3;
}

void print_row(const char* mode, const std::vector<double>& v) {
  std::printf("%-16s %-22s", g_lib.name.c_str(), mode);
  for (double x : v) std::printf(" %10.1f", x);
  std::printf("\n");
  std::fflush(stdout);
}

void run_candidate(const std::string& spec, int nthreads) {
  open_lib(spec);
  std::printf("# %s: %s\n", g_lib.name.c_str(), g_lib.info.c_str());
  if (!check_correct()) {
    std::printf("# %s: WRONG RESULTS on a 67x45x93 product; skipped\n", g_lib.name.c_str());
    return;
  }
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, size_t(nthreads));
  const Shape shapes[] = {{"1024^3", 1024, 1024, 1024, false},
                          {"2048^3", 2048, 2048, 2048, false},
                          {"mlp 256x1024x1024 NT", 256, 1024, 1024, true}};
  std::vector<double> one, all, tiles;
  for (const Shape& s : shapes) {
    Operands o(s);
    g_lib.set_threads(1);
    one.push_back(g_quick && s.m == 2048 ? 0.0 : gflops(s, [&] { o.call(s); }));
    g_lib.set_threads(nthreads);
    all.push_back(gflops(s, [&] { o.call(s); }));
    g_lib.set_threads(1);
    tiles.push_back(gflops(s, [&] { tiles_call(o, s, nthreads); }));
  }
  print_row("1 thread", one);
  print_row(("lib " + std::to_string(nthreads) + " threads").c_str(), all);
  print_row(("tbb tiles " + std::to_string(nthreads)).c_str(), tiles);

  const Shape s = shapes[0];
  for (int callers : {2, 4}) {
    // Library threads are per process (OpenBLAS, BLIS) or per calling thread (OpenMP's ICV,
    // which oneDNN reads): set them in every caller.
    auto lib_each = [&](int threads) {
      return gflops_concurrent(s, callers, [&, threads](Operands& o, int n) {
        g_lib.set_threads(threads);
        for (int i = 0; i < n; ++i) o.call(s);
      });
    };
    const double naive = lib_each(nthreads);
    const double split = lib_each(std::max(1, nthreads / callers));
    g_lib.set_threads(1);
    const double tb = gflops_concurrent(s, callers, [&](Operands& o, int n) {
      g_lib.set_threads(1);
      for (int i = 0; i < n; ++i) tiles_call(o, s, nthreads);
    });
    char mode[64];
    std::snprintf(mode, sizeof mode, "%d callers: each/split/tiles", callers);
    print_row(mode, {naive, split, tb});
  }
}

}  // namespace

int main(int argc, char** argv) {
  int nthreads = int(std::thread::hardware_concurrency());
  std::vector<std::string> candidates;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      nthreads = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--quick")) {
      g_quick = true;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr,
                   "usage: bp-blas-bench [--threads N] [--quick] [name=kind:/path/lib.so ...]\n"
                   "  kind: openblas | blis | dnnl\n");
      return 2;
    } else {
      candidates.push_back(argv[i]);
    }
  }
  if (candidates.empty()) {
    std::string found = BP_BLAS_CANDIDATES;  // "spec,spec,..." found by CMake
    for (size_t p = 0; p < found.size();) {
      size_t e = found.find(',', p);
      if (e == std::string::npos) e = found.size();
      if (e > p) candidates.push_back(found.substr(p, e - p));
      p = e + 1;
    }
  }
  if (candidates.empty()) {
    std::fprintf(stderr, "bp-blas-bench: no candidates given or found at configure time\n");
    return 2;
  }
  std::printf("# f32 sgemm, GFLOP/s, %d threads (hardware: %u)\n", nthreads,
              std::thread::hardware_concurrency());
  std::printf("%-16s %-22s %10s %10s %10s\n", "candidate", "mode", "1024^3", "2048^3",
              "mlp 256x1k^2 NT");
  std::printf("%-16s %-22s %10s %10s %10s\n", "", "(cooperation, 1024^3)", "lib N each", "lib N/H",
              "tbb tiles");
  std::fflush(stdout);
  int failures = 0;
  for (const std::string& c : candidates) {
    const pid_t pid = fork();
    if (pid == 0) {
      run_candidate(c, nthreads);
      std::fflush(stdout);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("# %s: child failed (status %d)\n", c.c_str(), status);
      ++failures;
    }
  }
  return failures ? 1 : 0;
}
