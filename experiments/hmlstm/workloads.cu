// workloads.cu: the driver's runners for workloads a-d. Each configuration is validated (every
// method's outputs and gradients against the pure reverse-mode select form, and a float64 host
// reference on a row slice) before anything is timed; then each method is timed over rotating input
// sets with the gradients reset between steps, so every backward writes fresh buffers. Workloads a
// and b also time the step recorded in a Graph per input set and replayed (mixed_graph,
// reverse_graph; dims up to RunContext::graph_max_dims), validated first like the eager methods.
#include "workloads.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "dualcast/dual.hpp"
#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/graph.hpp"

namespace hmexp {

using dualcast::Dual;

namespace {

/// Outputs and gradients of one method on one input set, copied to the host.
struct Result {
  std::vector<std::vector<float>> out;   // M
  std::vector<std::vector<float>> grad;  // K
};

/// Fills every cached block of this size with NaN: allocations the next step makes from the cache
/// start poisoned, so an element a kernel fails to write shows up as NaN in the comparison.
void poison_cache(Device device, const dualcast::Shape& shape, dualcast::DType dtype, int count) {
  dualcast::empty_cache(device);
  std::vector<Tensor> blocks;
  for (int j = 0; j < count; ++j) blocks.push_back(Tensor::full(shape, NAN, dtype, device));
  dualcast::synchronize(device);
  blocks.clear();
}

/// The outputs (a Var or an array of Vars) and the gradients of a set, copied to the host.
template <class Out>
Result collect(const Out& out, const CellSet& s) {
  Result r;
  if constexpr (std::is_same_v<std::remove_cvref_t<Out>, Var>) {
    r.out.push_back(out.value().template to_vector<float>());
  } else {
    for (auto& o : out) r.out.push_back(o.value().template to_vector<float>());
  }
  for (auto& v : s.x) r.grad.push_back(v.grad().template to_vector<float>());
  return r;
}

template <class Step>
Result run_once(CellSet& s, const Step& step, int poison) {
  s.zero_grad();
  poison_cache(s.x[0].device(), s.x[0].shape(), s.x[0].dtype(), poison);
  auto out = step(s);
  Result r = collect(out, s);
  s.zero_grad();
  return r;
}

/// One step per input set recorded in a Graph (zero_grad, forward, backward): replaying graph j
/// recomputes set j's outputs and gradients in place.
template <class Step>
struct CapturedSets {
  using Out = std::remove_cvref_t<decltype(std::declval<const Step&>()(std::declval<CellSet&>()))>;
  std::vector<dualcast::Graph> graphs;
  std::vector<Out> outs;
  CapturedSets(std::vector<CellSet>& sets, const Step& step, int poison) : graphs(sets.size()), outs(sets.size()) {
    for (auto& s : sets) s.zero_grad();
    poison_cache(sets[0].x[0].device(), sets[0].x[0].shape(), sets[0].x[0].dtype(), poison);
    for (std::size_t j = 0; j < sets.size(); ++j) {
      CellSet& s = sets[j];
      Out& o = outs[j];
      graphs[j].capture(s.x[0].device(), [&s, &o, &step] {
        s.zero_grad();
        o = step(s);
      });
    }
  }
};

/// Worst error of `got` against `want` over outputs and gradients; names the worst array.
double compare(const Result& got, const Result& want, std::string& worst) {
  double e = 0;
  for (std::size_t m = 0; m < want.out.size(); ++m) {
    const double x = dualcast::array_error(got.out[m], want.out[m], dualcast::ErrorScale::largest);
    if (x > e || std::isnan(x)) e = x, worst = "output " + std::to_string(m);
  }
  for (std::size_t k = 0; k < want.grad.size(); ++k) {
    const double x = dualcast::array_error(got.grad[k], want.grad[k], dualcast::ErrorScale::largest);
    if (x > e || std::isnan(x)) e = x, worst = "gradient " + std::to_string(k);
  }
  return e;
}

// ---- the float64 host reference on rows [0, rows) ------------------------------------------------

struct HostCell {
  std::int64_t dims = 0;
  FlagLayout layout = FlagLayout::rows;
  std::vector<float> z, zb;
  std::vector<std::vector<float>> x, adj;
  HostCell(const CellSet& s, std::int64_t d, FlagLayout l) : dims(d), layout(l) {
    if (s.z.defined()) {
      z = s.z.to_vector<float>();
      zb = s.zb.to_vector<float>();
    }
    for (const auto& v : s.x) x.push_back(v.value().to_vector<float>());
    for (const auto& a : s.adj) adj.push_back(a.to_vector<float>());
  }
  [[nodiscard]] std::size_t flag_index(std::int64_t e) const {
    return static_cast<std::size_t>(layout == FlagLayout::rows ? e / dims : e % dims);
  }
};

template <int K>
Dual<double, K> seed_arg(double v, int k) {
  return Dual<double, K>::variable(v, k);
}

/// Reference outputs and gradients (float64) of the first `rows` rows.
struct RefResult {
  std::vector<std::vector<double>> out, grad;
};

template <int K, int M, class Eval>
RefResult host_reference(const HostCell& h, std::int64_t rows, const Eval& eval) {
  const std::int64_t n = rows * h.dims;
  RefResult r;
  r.out.assign(M, std::vector<double>(static_cast<std::size_t>(n)));
  r.grad.assign(K, std::vector<double>(static_cast<std::size_t>(n)));
  for (std::int64_t e = 0; e < n; ++e) {
    const auto j = static_cast<std::size_t>(e);
    Dual<double, K> d[K];
    for (int k = 0; k < K; ++k) d[k] = seed_arg<K>(h.x[static_cast<std::size_t>(k)][j], k);
    Dual<double, K> o[M];
    eval(h, e, d, o);
    for (int m = 0; m < M; ++m) r.out[static_cast<std::size_t>(m)][j] = o[m].val;
    for (int k = 0; k < K; ++k) {
      double g = 0;
      for (int m = 0; m < M; ++m) g += static_cast<double>(h.adj[static_cast<std::size_t>(m)][j]) * o[m].d[k];
      r.grad[static_cast<std::size_t>(k)][j] = g;
    }
  }
  return r;
}

/// Worst error of the leading elements of each array of `got` against the float64 reference.
double compare_prefix(const Result& got, const RefResult& ref, std::string& worst) {
  double e = 0;
  auto one = [&](const std::vector<float>& g, const std::vector<double>& w, const std::string& name) {
    if (g.size() < w.size()) {
      e = INFINITY, worst = name + " (size)";
      return;
    }
    const std::vector<double> gd(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(w.size()));
    const double x = dualcast::array_error(gd, w, dualcast::ErrorScale::largest);
    if (x > e || std::isnan(x)) e = x, worst = name;
  };
  for (std::size_t m = 0; m < ref.out.size(); ++m) one(got.out[m], ref.out[m], "output " + std::to_string(m));
  for (std::size_t k = 0; k < ref.grad.size(); ++k) one(got.grad[k], ref.grad[k], "gradient " + std::to_string(k));
  return e;
}

// ---- timing -------------------------------------------------------------------------------------------

template <class Prepare, class Step>
dcexp::StepTimes time_on_device(const RunContext& ctx, Prepare&& prepare, Step&& step) {
#if !defined(__CUDACC__)
  if (ctx.device.is_cuda()) throw ExperimentError("this driver was compiled without nvcc: it cannot time on the GPU", 2);
#endif
  return dcexp::time_steps(ctx.device, prepare, step, 0, ctx.reps, dcexp::EventStream::legacy);
}

/// Warm-up, allocator check, timing of one method over rotating sets.
/// Times replays of the captured sets (graph j replays set j), as time_method does eager steps.
template <class Captured>
void time_captured(const RunContext& ctx, Captured& cap, Measurement& m) {
  const auto n = static_cast<int>(cap.graphs.size());
  auto prepare = [](int) {};
  auto body = [&](int r) { cap.graphs[static_cast<std::size_t>(r % n)].replay(); };
  const int warm = std::max(ctx.warmup, n);
  for (int r = 0; r < warm; ++r) body(r);
  dualcast::synchronize(ctx.device);
  m.kernels_per_step = static_cast<int>(cap.graphs[0].num_nodes());  // graph nodes per step
  const auto before = dualcast::memory_stats(ctx.device).device_malloc_calls;
  m.times = time_on_device(ctx, prepare, body);
  m.times.warmup = warm;
  m.mallocs_during_timing = dualcast::memory_stats(ctx.device).device_malloc_calls - before;
  m.input_sets = n;
  if (m.mallocs_during_timing != 0 && ctx.device.is_cuda())
    m.note += (m.note.empty() ? "" : "; ") + std::to_string(m.mallocs_during_timing) +
              " device allocations during timing";
}

template <class Step>
void time_method(const RunContext& ctx, std::vector<CellSet>& sets, const Step& step, Measurement& m) {
  const auto nsets = static_cast<int>(sets.size());
  auto prepare = [&](int r) { sets[static_cast<std::size_t>(r % nsets)].zero_grad(); };
  auto body = [&](int r) { (void)step(sets[static_cast<std::size_t>(r % nsets)]); };
  // Warm-up: at least one pass over every set, so every buffer size the step needs is cached.
  const int warm = std::max(ctx.warmup, nsets);
  for (int r = 0; r < warm; ++r) {
    prepare(r);
    body(r);
  }
  dualcast::synchronize(ctx.device);
  const auto nodes0 = dualcast::autograd_stats().nodes_created;
  prepare(0);
  body(0);
  dualcast::synchronize(ctx.device);
  m.kernels_per_step = static_cast<int>(dualcast::autograd_stats().nodes_created - nodes0);
  const auto before = dualcast::memory_stats(ctx.device).device_malloc_calls;
  m.times = time_on_device(ctx, prepare, body);
  m.times.warmup = warm + 1;
  m.mallocs_during_timing = dualcast::memory_stats(ctx.device).device_malloc_calls - before;
  m.input_sets = nsets;
  for (auto& s : sets) s.zero_grad();
  if (m.mallocs_during_timing != 0 && ctx.device.is_cuda())  // the CPU allocates every tensor afresh
    m.note += (m.note.empty() ? "" : "; ") + std::to_string(m.mallocs_during_timing) +
              " device allocations during timing";
}

void progress(const RunContext& ctx, const Measurement& m) {
  if (!ctx.progress) return;
  char buf[512];
  const auto& t = m.times.primary();
  std::snprintf(buf, sizeof buf, "  %s%s%s dims=%lld %-11s median %9.4f ms (p10 %.4f, p90 %.4f; wall %.4f) %s",
                m.workload.c_str(), m.variant.empty() ? "" : " ", m.variant.c_str(),
                static_cast<long long>(m.dims), m.method.c_str(), t.median, t.p10, t.p90,
                m.times.wall_ms.median, m.floor_ms > 0 ? ("floor " + std::to_string(m.floor_ms)).c_str() : "");
  ctx.progress(buf);
}

Measurement base(const std::string& w, const std::string& variant, std::int64_t dims,
                 const std::string& method, Partials p, int K, int M, const RunContext& ctx) {
  Measurement m;
  m.workload = w;
  m.variant = variant;
  m.dims = dims;
  m.method = method;
  const std::int64_t n = dims * dims;
  const int elem = static_cast<int>(dualcast::dtype_size(ctx.dtype));
  m.floor_bytes = bytes_moved(n, K, M, Partials::recompute, elem);
  m.floor_ms = dcexp::floor_ms(m.floor_bytes, ctx.copy_gbps);
  if (method == "reverse") {
    m.policy = "";
    m.bytes = 0;  // a chain of kernels: counted only as the configuration's floor
  } else {
    m.policy = dualcast::partials_name(p);
    m.bytes = bytes_moved(n, K, M, p, elem);
  }
  return m;
}

void fail_validation(const std::string& what, double err, double tol, const std::string& worst) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "VALIDATION FAILED: %s: max relative error %.3e > %.1e (worst: %s)",
                what.c_str(), err, tol, worst.c_str());
  throw ExperimentError(buf, 4);
}

/// The common shape of a-d: validate all methods on set 0, then time each.
template <int K, int M, class MixedStep, class ReverseStep, class RefEval>
std::vector<Measurement> run_cell_workload(const RunContext& ctx, const std::string& w,
                                           const std::string& variant, std::int64_t dims,
                                           std::vector<CellSet>& sets, FlagLayout layout,
                                           const MixedStep& mixed, const ReverseStep& reverse,
                                           const RefEval& ref_eval, int poison, bool graphs = false) {
  const std::string label = w + (variant.empty() ? "" : " " + variant) + " dims=" + std::to_string(dims);
  // ---- validation on set 0 ----
  const Result rev = run_once(sets[0], reverse, poison);
  const HostCell host(sets[0], dims, layout);
  const std::int64_t rows = std::min<std::int64_t>(dims, 64);
  const RefResult ref = host_reference<K, M>(host, rows, ref_eval);
  std::string worst;
  double err_rev = compare_prefix(rev, ref, worst);
  if (!(err_rev <= ctx.rtol)) fail_validation(label + ": reverse mode vs float64 reference (rows 0-63)", err_rev, ctx.rtol, worst);
  std::vector<Measurement> out;
  double err_mixed[2] = {0, 0};
  const Partials policies[2] = {Partials::recompute, Partials::store};
  for (int pi = 0; pi < 2; ++pi) {
    const Partials p = policies[pi];
    const Result got = run_once(sets[0], [&](CellSet& s) { return mixed(s, p); }, poison);
    double e1 = compare(got, rev, worst);
    if (!(e1 <= ctx.rtol))
      fail_validation(label + ": mixed (" + dualcast::partials_name(p) + ") vs reverse mode", e1, ctx.rtol, worst);
    double e2 = compare_prefix(got, ref, worst);
    if (!(e2 <= ctx.rtol))
      fail_validation(label + ": mixed (" + dualcast::partials_name(p) + ") vs float64 reference", e2, ctx.rtol, worst);
    err_mixed[pi] = std::max(e1, e2);
  }
  // ---- timing ----
  const char* names[2] = {"mixed", "mixed_store"};
  for (int pi = 0; pi < 2; ++pi) {
    Measurement m = base(w, variant, dims, names[pi], policies[pi], K, M, ctx);
    m.validated = true;
    m.max_rel_err = err_mixed[pi];
    const Partials p = policies[pi];
    time_method(ctx, sets, [&](CellSet& s) { return mixed(s, p); }, m);
    progress(ctx, m);
    out.push_back(std::move(m));
  }
  Measurement m = base(w, variant, dims, "reverse", Partials::recompute, K, M, ctx);
  m.validated = true;
  m.max_rel_err = err_rev;
  time_method(ctx, sets, reverse, m);
  progress(ctx, m);
  out.push_back(std::move(m));
  if (graphs && dims <= ctx.graph_max_dims) {
    // The same forward + backward recorded once per input set and replayed: what the step costs
    // without the host's launches. Validated (replay of set 0) against the eager reverse mode.
    auto recompute = [&](CellSet& s) { return mixed(s, Partials::recompute); };
    auto time_graph = [&](const char* name, auto& step_fn, Partials p) {
      CapturedSets cap(sets, step_fn, poison);
      cap.graphs[0].replay();
      const Result got = collect(cap.outs[0], sets[0]);
      const double e = compare(got, rev, worst);
      if (!(e <= ctx.rtol)) fail_validation(label + ": " + name + " (replayed) vs eager reverse mode", e, ctx.rtol, worst);
      Measurement g = base(w, variant, dims, name, p, K, M, ctx);
      g.validated = true;
      g.max_rel_err = e;
      time_captured(ctx, cap, g);
      progress(ctx, g);
      out.push_back(std::move(g));
      for (auto& s : sets) s.zero_grad();
    };
    time_graph("mixed_graph", recompute, Partials::recompute);
    time_graph("reverse_graph", reverse, Partials::recompute);
  }
  return out;
}

// ---- reference evaluators ---------------------------------------------------------------------------

struct RefA {
  void operator()(const HostCell& h, std::int64_t e, const Dual<double, 4>* d, Dual<double, 4>* o) const {
    const std::size_t fi = h.flag_index(e);
    o[0] = CellUpdate{}(static_cast<double>(h.z[fi]), static_cast<double>(h.zb[fi]), d[0], d[1], d[2], d[3]);
  }
};
struct RefB {
  void operator()(const HostCell& h, std::int64_t e, const Dual<double, 6>* d, Dual<double, 6>* o) const {
    const std::size_t fi = h.flag_index(e);
    auto r = Cell{}(static_cast<double>(h.z[fi]), static_cast<double>(h.zb[fi]), d[0], d[1], d[2], d[3], d[4], d[5]);
    o[0] = std::get<0>(r);
    o[1] = std::get<1>(r);
  }
};
template <int K>
struct RefC {
  template <std::size_t... I>
  static Dual<double, K> call(const Dual<double, K>* d, std::index_sequence<I...>) {
    return ArityProduct{}(d[I]...);
  }
  void operator()(const HostCell&, std::int64_t, const Dual<double, K>* d, Dual<double, K>* o) const {
    o[0] = call(d, std::make_index_sequence<K>{});
  }
};

template <int K>
std::vector<Measurement> run_c_k(const RunContext& ctx16, std::int64_t dims) {
  RunContext ctx = ctx16;  // the arity study is float32 at every --precision
  ctx.dtype = dualcast::DType::float32;
  std::vector<CellSet> sets;
  const int nsets = sets_for(ctx, dims, K, 1);
  check_fits(ctx, bytes_needed_cell(dims, K, 1, nsets), "workload c (K=" + std::to_string(K) + ", dims " + std::to_string(dims) + ")");
  for (int j = 0; j < nsets; ++j) sets.push_back(make_arity_set(dims, K, ctx.device, 300 + static_cast<std::uint64_t>(j)));
  return run_cell_workload<K, 1>(ctx, "c", "K=" + std::to_string(K), dims, sets, FlagLayout::rows,
                                 [](const CellSet& s, Partials p) { return step_c_mixed(s, p); },
                                 [](const CellSet& s) { return step_c_reverse(s); }, RefC<K>{}, 4 * K + 6);
}

}  // namespace

/// Checks that a configuration fits before allocating it.
void check_fits(const RunContext& ctx, double need, const std::string& what) {
  double avail = 0;
  if (ctx.device.is_cuda()) {
#if defined(__CUDACC__)
    const auto [free_b, total_b] = dcexp::cuda_mem_info();
    (void)total_b;
    const auto st = dualcast::memory_stats(ctx.device);
    avail = static_cast<double>(free_b) + static_cast<double>(st.bytes_held - st.bytes_in_use);
#else
    return;
#endif
  } else {
    avail = static_cast<double>(dcexp::host_available_bytes());
    if (avail == 0) return;
  }
  if (need > 0.9 * avail) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s needs about %.2f GiB of %s memory but only %.2f GiB is available; choose smaller "
                  "--dims (or fewer workloads)",
                  what.c_str(), need / (1u << 30), ctx.device.is_cuda() ? "device" : "host", avail / (1u << 30));
    throw ExperimentError(buf, 3);
  }
}

int sets_for(const RunContext& ctx, std::int64_t dims, int K, int M) {
  const auto set_bytes = static_cast<std::size_t>(dims * dims * (K + M)) * dualcast::dtype_size(ctx.dtype);
  return dcexp::rotation_sets(set_bytes, ctx.cache_bytes, ctx.max_sets);
}

double bytes_needed_cell(std::int64_t dims, int K, int M, int sets, int elem_bytes) {
  const double mat = static_cast<double>(dims) * static_cast<double>(dims) * elem_bytes;
  const double per_set = static_cast<double>(K + M + K);  // inputs, adjoints, gradients kept per set
  const double workspace = std::max<double>(M * K + 2 * M + K, 4.0 * K + 12.0 * M + 8.0);  // partials / reverse intermediates
  return mat * (sets * per_set + workspace);
}

namespace {
/// The input sets of cell workload `workload` (K inputs, M adjoints of dims x dims; flags in
/// `layout`), as many as sets_for rotates, once check_fits has passed; set j is seeded seed0 + j.
std::vector<CellSet> cell_sets(const RunContext& ctx, const char* workload, std::int64_t dims, int K,
                               int M, FlagLayout layout, std::uint64_t seed0) {
  const int nsets = sets_for(ctx, dims, K, M);
  check_fits(ctx, bytes_needed_cell(dims, K, M, nsets, static_cast<int>(dualcast::dtype_size(ctx.dtype))),
             std::string("workload ") + workload + " (dims " + std::to_string(dims) + ")");
  std::vector<CellSet> sets;
  for (int j = 0; j < nsets; ++j)
    sets.push_back(make_cell_set(dims, K, M, layout, ctx.device, seed0 + static_cast<std::uint64_t>(j), ctx.dtype));
  return sets;
}
}  // namespace

std::vector<Measurement> run_a(const RunContext& ctx, std::int64_t dims) {
  std::vector<CellSet> sets = cell_sets(ctx, "a", dims, 4, 1, FlagLayout::rows, 100);
  return run_cell_workload<4, 1>(ctx, "a", "", dims, sets, FlagLayout::rows,
                                 [](const CellSet& s, Partials p) { return step_a_mixed(s, p); },
                                 [](const CellSet& s) { return step_a_reverse(s); }, RefA{}, 24,
                                 ctx.graphs);
}

std::vector<Measurement> run_b(const RunContext& ctx, std::int64_t dims) {
  std::vector<CellSet> sets = cell_sets(ctx, "b", dims, 6, 2, FlagLayout::rows, 200);
  return run_cell_workload<6, 2>(ctx, "b", "", dims, sets, FlagLayout::rows,
                                 [](const CellSet& s, Partials p) { return step_b_mixed(s, p); },
                                 [](const CellSet& s) { return step_b_reverse(s); }, RefB{}, 36,
                                 ctx.graphs);
}

std::vector<Measurement> run_c(const RunContext& ctx, std::int64_t dims, int K) {
  switch (K) {
    case 1: return run_c_k<1>(ctx, dims);
    case 2: return run_c_k<2>(ctx, dims);
    case 3: return run_c_k<3>(ctx, dims);
    case 4: return run_c_k<4>(ctx, dims);
    case 5: return run_c_k<5>(ctx, dims);
    case 6: return run_c_k<6>(ctx, dims);
    case 7: return run_c_k<7>(ctx, dims);
    case 8: return run_c_k<8>(ctx, dims);
    case 9: return run_c_k<9>(ctx, dims);
    case 10: return run_c_k<10>(ctx, dims);
    default: throw ExperimentError("workload c: arity must be 1..10", 2);
  }
}

std::vector<Measurement> run_d(const RunContext& ctx, std::int64_t dims, FlagLayout layout) {
  std::vector<CellSet> sets = cell_sets(ctx, "d", dims, 4, 1, layout, 400);
  return run_cell_workload<4, 1>(ctx, "d", flag_layout_name(layout), dims, sets, layout,
                                 [](const CellSet& s, Partials p) { return step_a_mixed(s, p); },
                                 [](const CellSet& s) { return step_a_reverse(s); }, RefA{}, 24);
}

// ---- validation directory ------------------------------------------------------------------------------

namespace {
void write_bin(const std::string& dir, const std::string& name, const void* data, std::size_t bytes) {
  const std::string path = dir + "/" + name + ".bin";
  std::ofstream out(path, std::ios::binary);
  if (!out) throw ExperimentError("cannot write " + path, 1);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) throw ExperimentError("error writing " + path, 1);
}

void put(std::vector<ValArray>& list, const std::string& dir, const std::string& name, const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  write_bin(dir, name, v.data(), v.size() * sizeof(float));
  ValArray a;
  a.name = name;
  for (int d = 0; d < t.shape().rank(); ++d) a.shape.push_back(t.shape()[d]);
  a.dtype = "float32";
  list.push_back(std::move(a));
}
}  // namespace

std::vector<ValArray> write_cell_validation(const std::string& dir, std::int64_t dims, Device device) {
  std::vector<ValArray> list;
  {
    CellSet s = make_cell_set(dims, 4, 1, FlagLayout::rows, device, 900);
    (void)step_a_mixed(s, Partials::recompute);
    put(list, dir, "a_z", s.z);
    put(list, dir, "a_zb", s.zb);
    const char* names[4] = {"c", "f", "i", "g"};
    for (int k = 0; k < 4; ++k) put(list, dir, std::string("a_") + names[k], s.x[static_cast<std::size_t>(k)].value());
    put(list, dir, "a_adj", s.adj[0]);
    for (int k = 0; k < 4; ++k) put(list, dir, std::string("a_grad_") + names[k], s.x[static_cast<std::size_t>(k)].grad());
  }
  {
    CellSet s = make_cell_set(dims, 6, 2, FlagLayout::rows, device, 901);
    (void)step_b_mixed(s, Partials::recompute);
    put(list, dir, "b_z", s.z);
    put(list, dir, "b_zb", s.zb);
    const char* names[6] = {"c", "h", "f", "i", "o", "g"};
    for (int k = 0; k < 6; ++k) put(list, dir, std::string("b_") + names[k], s.x[static_cast<std::size_t>(k)].value());
    put(list, dir, "b_adj_c", s.adj[0]);
    put(list, dir, "b_adj_h", s.adj[1]);
    for (int k = 0; k < 6; ++k) put(list, dir, std::string("b_grad_") + names[k], s.x[static_cast<std::size_t>(k)].grad());
  }
  return list;
}

}  // namespace hmexp
