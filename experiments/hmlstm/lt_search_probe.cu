// lt_search_probe.cu: how fast cuBLASLt can run the HM-LSTM step's skinny float32 products (M = 64
// rows, exact float32: CUBLAS_COMPUTE_32F) when its whole configuration space is searched, against
// cublasSgemm's own choice (issue 31, item 2). A standalone program (cuBLAS and the CUDA runtime only),
// so it builds in seconds on the device without the library:
//
//   nvcc -O2 -std=c++17 -arch=sm_90 experiments/hmlstm/lt_search_probe.cu -lcublasLt -lcublas -o lt_probe
//   ./lt_probe [--bursts 5] [--calls 20] [--top 6]
//
// Per shape it times, as throughput (a burst of back-to-back calls between two events, median of the
// bursts; the step runs its products back to back): cublasSgemm; cuBLASLt's heuristic first choice;
// and every configuration cublasLtMatmulAlgoCheck accepts among algorithm ids x tiles x stages x
// split-K {1,2,3,4,6,8,12,16,24,32} x each reduction scheme the algorithm supports (screened with one
// short burst each; the 40 fastest re-timed). The best results are checked against cublasSgemm's output. Why: the library's per-shape search (src/blas_lt.cpp)
// times only the heuristic's list and compute-type split-K variants, one call at a time, and changed
// nothing in the step (2026-11-28); this says what a wider search could give before it is built.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    auto e_ = (x);                                                                 \
    if (static_cast<int>(e_) != 0) {                                               \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

int g_bursts = 5, g_calls = 20, g_top = 6;
constexpr std::size_t kWs = std::size_t{32} << 20;

struct Shape {
  const char* name;
  bool tb;  // row-major C[M,N] = A[M,K] * (tb ? B[N,K]^T : B[K,N])
  int M, N, K, lda, ldb, ldc;
};

template <class F>
float burst_us(F&& call, cudaStream_t s, int bursts = g_bursts, int calls = g_calls) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) call();
  std::vector<float> t;
  for (int r = 0; r < bursts; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < calls; ++i) call();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Result {
  float us;
  std::string what;
  cublasLtMatmulAlgo_t algo;
};

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, stages = 0, split = 1, swz = 0;
  uint32_t scheme = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
  char buf[160];
  std::snprintf(buf, sizeof buf, "id %d tile %d stages %d splitK %d scheme %u swizzle %d", id, tile, stages, split,
                scheme, swz);
  return buf;
}

void probe(cublasHandle_t blas, cublasLtHandle_t lt, void* ws, const Shape& sh, cudaStream_t s) {
  const std::size_t na = std::size_t(sh.M) * sh.lda, nb = std::size_t(sh.tb ? sh.N : sh.K) * sh.ldb,
                    nc = std::size_t(sh.M) * sh.ldc;
  std::vector<float> h(std::max({na, nb, nc}));
  float *a, *b, *c, *ref;
  CK(cudaMalloc(&a, na * 4));
  CK(cudaMalloc(&b, nb * 4));
  CK(cudaMalloc(&c, nc * 4));
  CK(cudaMalloc(&ref, nc * 4));
  srand(7);
  for (std::size_t i = 0; i < na; ++i) h[i] = rand() / float(RAND_MAX) - 0.5f;
  CK(cudaMemcpy(a, h.data(), na * 4, cudaMemcpyHostToDevice));
  for (std::size_t i = 0; i < nb; ++i) h[i] = (rand() / float(RAND_MAX) - 0.5f) * 0.1f;
  CK(cudaMemcpy(b, h.data(), nb * 4, cudaMemcpyHostToDevice));
  const float one = 1.f, zero = 0.f;
  // Column-major C^T[N, M] = op(B)^T[N, K] A^T[K, M].
  const cublasOperation_t opb = sh.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto sgemm = [&] {
    CK(cublasSgemm(blas, opb, CUBLAS_OP_N, sh.N, sh.M, sh.K, &one, b, sh.ldb, a, sh.lda, &zero, ref, sh.ldc));
  };
  const float us_sgemm = burst_us(sgemm, s);
  std::vector<float> want(nc), got(nc);
  CK(cudaMemcpy(want.data(), ref, nc * 4, cudaMemcpyDeviceToHost));

  cublasLtMatmulDesc_t op;
  CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, sh.tb ? sh.K : sh.N, sh.tb ? sh.N : sh.K, sh.ldb));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, sh.K, sh.M, sh.lda));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, sh.N, sh.M, sh.ldc));
  auto run = [&](const cublasLtMatmulAlgo_t* algo) {
    return cublasLtMatmul(lt, op, &one, b, la, a, lb, &zero, c, lc, c, lc, algo, ws, kWs, s);
  };
  auto max_err = [&]() {
    CK(cudaMemcpy(got.data(), c, nc * 4, cudaMemcpyDeviceToHost));
    double e = 0, m = 0;
    for (int i = 0; i < sh.M; ++i)
      for (int j = 0; j < sh.N; ++j) {
        const std::size_t k = std::size_t(i) * sh.ldc + j;
        e = std::max(e, std::fabs(double(got[k]) - want[k]));
        m = std::max(m, std::fabs(double(want[k])));
      }
    return e / m;
  };

  std::vector<Result> results;
  auto time_algo = [&](const cublasLtMatmulAlgo_t& algo, const std::string& tag) {
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &algo, &chk) != CUBLAS_STATUS_SUCCESS) return;
    if (chk.workspaceSize > kWs) return;
    if (run(&algo) != CUBLAS_STATUS_SUCCESS) {
      (void)cudaGetLastError();
      return;
    }
    CK(cudaStreamSynchronize(s));
    const float us = burst_us([&] { run(&algo); }, s, 1, 5);  // screening; the best are re-timed below
    results.push_back({us, tag + describe(algo), algo});
  };

  // The heuristic's list.
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t wsb = kWs;
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t heur[32];
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, heur, &found));
  float us_heur0 = -1;
  for (int i = 0; i < found; ++i) {
    const std::size_t before = results.size();
    time_algo(heur[i].algo, "heuristic #" + std::to_string(i) + ": ");
    if (i == 0 && results.size() > before) us_heur0 = results.back().us;
  }
  const std::size_t n_heur = results.size();

  // The whole space.
  int ids[256], nids = 0;
  CK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                              256, ids, &nids));
  int tried = 0;
  for (int ii = 0; ii < nids; ++ii) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                               ids[ii], &base) != CUBLAS_STATUS_SUCCESS)
      continue;
    size_t w = 0;
    int tiles[128], stages[64];
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &w);
    int ntiles = std::min<int>(w / sizeof(int), 128);
    if (ntiles > 0) cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &w);
    else tiles[ntiles++] = CUBLASLT_MATMUL_TILE_UNDEFINED;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &w);
    int nstages = std::min<int>(w / sizeof(int), 64);
    if (nstages > 0) cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof stages, &w);
    else stages[nstages++] = CUBLASLT_MATMUL_STAGES_UNDEFINED;
    int splitk_ok = 0;
    uint32_t schemes = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &w);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes, &w);
    for (int ti = 0; ti < ntiles; ++ti)
      for (int si = 0; si < nstages; ++si)
        for (int split : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}) {
          if (split > 1 && !splitk_ok) continue;
          for (uint32_t scheme : {0u, 1u, 2u, 4u}) {
            if ((split == 1) != (scheme == 0)) continue;
            if (scheme && !(schemes & scheme)) continue;
            cublasLtMatmulAlgo_t algo = base;
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[ti], sizeof(int));
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages[si], sizeof(int));
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split);
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme);
            ++tried;
            time_algo(algo, "space: ");
          }
        }
  }
  auto by_time = [](const Result& x, const Result& y) { return x.us < y.us; };
  std::sort(results.begin(), results.end(), by_time);
  if (results.size() > 40) results.resize(40);
  for (Result& r : results) r.us = burst_us([&] { run(&r.algo); }, s);
  std::sort(results.begin(), results.end(), by_time);
  std::printf("\n%s: M %d N %d K %d (%s), %.1f MFLOP\n", sh.name, sh.M, sh.N, sh.K, sh.tb ? "B^T" : "B",
              2.0 * sh.M * sh.N * sh.K / 1e6);
  std::printf("  cublasSgemm %.2f us (%.1f TFLOP/s); Lt heuristic first %.2f us; %zu heuristic + %d space "
              "configurations, %zu ran\n",
              us_sgemm, 2.0 * sh.M * sh.N * sh.K / us_sgemm / 1e6, us_heur0, n_heur, tried, results.size());
  for (int i = 0; i < g_top && i < static_cast<int>(results.size()); ++i) {
    run(&results[i].algo);
    CK(cudaStreamSynchronize(s));
    std::printf("  %6.2f us  %5.1f TFLOP/s  err %.1e  %s\n", results[i].us,
                2.0 * sh.M * sh.N * sh.K / results[i].us / 1e6, max_err(), results[i].what.c_str());
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ref);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--bursts")) g_bursts = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--calls")) g_calls = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--top")) g_top = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, cuBLASLt %zu, bursts %d of %d calls\n", prop.name, cublasLtGetVersion(), g_bursts, g_calls);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t blas;
  CK(cublasCreate(&blas));
  CK(cublasSetStream(blas, s));
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  void* ws;
  CK(cudaMalloc(&ws, kWs));
  // The step's four skinny shapes (gates.hpp): forward X[64, K] Wcat[K, 2049]; backward dS[64, 2049]
  // Wcat^T. K = 3H + 4 for layers 1-2 and 2H + 4 for the top layer, H = 512.
  const Shape shapes[] = {
      {"forward K=1540", false, 64, 2049, 1540, 1540, 2049, 2049},
      {"forward K=1028", false, 64, 2049, 1028, 1028, 2049, 2049},
      {"backward dX K=1540", true, 64, 1540, 2049, 2049, 2049, 1540},
      {"backward dX K=1028", true, 64, 1028, 2049, 2049, 2049, 1028},
  };
  for (const Shape& sh : shapes) probe(blas, lt, ws, sh, s);
  return 0;
}
