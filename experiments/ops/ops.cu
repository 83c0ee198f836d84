// ops.cu: ops_bench's ops (ops_bench.hpp): their inputs, forward and adjoint, the bytes and flops each
// direction must move, one checked forward + backward, the float64 host reference written from the
// definitions, and the checks made before anything is timed (CPU against the reference, GPU against
// the CPU).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "ops_bench.hpp"

namespace opsbench {

const OpSpec* find_op(const std::string& name) {
  for (const auto& op : kOps)
    if (name == op.name) return &op;
  return nullptr;
}

/// The inputs of `op` at size n on `device`. Philox streams depend only on (seed, index), so the CPU
/// and the GPU get the same values and their results can be compared element by element.
std::vector<Tensor> make_inputs(const OpSpec& op, std::int64_t n, Device device) {
  const std::uint64_t base = 1000 * (static_cast<std::uint64_t>(op.id) + 1);
  const Shape sq{n, n};
  switch (op.id) {
    case OpId::pow:  // a positive base keeps x^y and log(x) (the exponent's gradient) finite
      return {Tensor::uniform(sq, device, base + 1, 0.5, 2.0), Tensor::uniform(sq, device, base + 2, -2.0, 2.0)};
    case OpId::broadcast:
      return {Tensor::randn(sq, device, base + 1), Tensor::randn(Shape{1, n}, device, base + 2)};
    case OpId::transpose:
    case OpId::sum:
    case OpId::sum_axis1:
      return {Tensor::randn(sq, device, base + 1)};
    default:
      return {Tensor::randn(sq, device, base + 1), Tensor::randn(sq, device, base + 2)};
  }
}

std::vector<Var> make_params(const OpSpec& op, std::int64_t n, Device device) {
  std::vector<Var> p;
  for (auto& t : make_inputs(op, n, device)) p.push_back(Var::param(std::move(t)));
  return p;
}

Var forward(const OpSpec& op, const std::vector<Var>& p) {
  switch (op.id) {
    case OpId::add: return p[0] + p[1];
    case OpId::mul: return p[0] * p[1];
    case OpId::transpose: return dualcast::transpose(p[0]);
    case OpId::pow: return dualcast::pow(p[0], p[1]);
    case OpId::broadcast: return p[0] + p[1];
    case OpId::sum: return dualcast::sum(p[0]);
    case OpId::sum_axis1: return dualcast::sum(p[0], 1);
    case OpId::matmul: return dualcast::matmul(p[0], p[1]);
  }
  DUALCAST_FAIL("ops_bench: unknown op");
}

/// A random adjoint (never ones: a backward that ignores it, or transposes it wrongly, shows).
Tensor make_seed(const OpSpec& op, const Var& y, Device device) {
  return Tensor::randn(y.shape(), device, 777 + static_cast<std::uint64_t>(op.id));
}

/// Bytes a direction must move at the least: each input it depends on read once, each result
/// written once (float32). The op library may move more (e.g. its recompute backward reloads inputs
/// a gradient does not need); GB/s against this count says how close it comes to the floor.
double bytes_moved(const OpSpec& op, std::int64_t n_, bool backward) {
  const double n = static_cast<double>(n_), nn = n * n, f = 4.0;
  switch (op.id) {
    case OpId::add: return f * 3 * nn;                       // fwd x,y -> z; bwd g -> dx,dy
    case OpId::mul: return f * (backward ? 5 * nn : 3 * nn);  // bwd g,x,y -> dx,dy
    case OpId::transpose: return f * 2 * nn;
    case OpId::pow: return f * (backward ? 5 * nn : 3 * nn);  // bwd g,x,y -> dx,dy
    case OpId::broadcast: return f * (2 * nn + n);            // fwd x,b -> z; bwd g -> dx,db
    case OpId::sum: return f * (nn + 1);
    case OpId::sum_axis1: return f * (nn + n);
    case OpId::matmul: return f * 3 * nn * (backward ? 2 : 1);  // not used for the rate
  }
  return 0;
}

/// Floating-point operations of a direction (matmul only: 2n^3 forward, 4n^3 for dA and dB).
double flops(const OpSpec& op, std::int64_t n_, bool backward) {
  if (op.id != OpId::matmul) return 0;
  const double n = static_cast<double>(n_);
  return (backward ? 4.0 : 2.0) * n * n * n;
}

// =====================================================================================================
// validation
// =====================================================================================================

RunResult run_once(const OpSpec& op, std::int64_t n, Device device) {
  RunResult r;
  std::vector<Var> p = make_params(op, n, device);
  dualcast::synchronize(device);
  const double t0 = dcexp::now_ms();
  Var y = forward(op, p);
  dualcast::synchronize(device);
  r.fwd_ms = dcexp::now_ms() - t0;
  r.seed = make_seed(op, y, device);
  dualcast::synchronize(device);
  const double t1 = dcexp::now_ms();
  y.backward(r.seed);
  dualcast::synchronize(device);
  r.bwd_ms = dcexp::now_ms() - t1;
  r.out = y.value();
  for (const auto& v : p) {
    r.inputs.push_back(v.value());
    r.grads.push_back(v.grad());
  }
  return r;
}

/// Fills cached device blocks of the sizes the op allocates with NaN, so that an element a kernel of
/// the next run forgets to write shows up as NaN in the comparison instead of as stale data.
void poison_device_cache(Device device, std::int64_t n) {
  if (!device.is_cuda()) return;
  dualcast::empty_cache(device);
  std::vector<Tensor> blocks;
  for (int i = 0; i < kPoisonBlocks; ++i) blocks.push_back(Tensor::full(Shape{n, n}, NAN, DType::float32, device));
  for (int i = 0; i < 2; ++i) blocks.push_back(Tensor::full(Shape{n}, NAN, DType::float32, device));
  dualcast::synchronize(device);
}

/// Error of `got` against `want` (same shape and device), computed where they live; NaN anywhere
/// makes it NaN, which fails every `err <= tol` test.
double max_error(const Tensor& got, const Tensor& want, Metric metric) {
  DUALCAST_CHECK(got.shape() == want.shape(), "ops_bench: result of shape ", got.shape().str(),
                 " where ", want.shape().str(), " was expected");
  dualcast::NoGradGuard no_tape;
  const Var g(got), w(want);
  const Var diff = dualcast::abs(g - w);
  if (metric == Metric::elementwise) return dualcast::amax(diff / dualcast::max(dualcast::abs(w), 1.0)).item();
  const double scale = std::max(1.0, dualcast::amax(dualcast::abs(w)).item());
  return dualcast::amax(diff).item() / scale;
}

/// host error of got against want: dualcast::array_error with the op's scale (elementwise, or
/// normwise for matmul); infinity for a NaN.
double host_error(const std::vector<double>& got, const std::vector<double>& want, Metric metric) {
  return dualcast::array_error(got, want,
                               metric == Metric::elementwise ? dualcast::ErrorScale::elementwise
                                                             : dualcast::ErrorScale::largest_or_one);
}

/// The op's output and gradients in float64 from the same float32 inputs, by plain loops written
/// from the definitions, independent of dualcast's kernels and derivative rules.
void reference(const OpSpec& op, std::int64_t n, const std::vector<std::vector<double>>& in,
               const std::vector<double>& g, std::vector<double>& out,
               std::vector<std::vector<double>>& grads) {
  const auto N = static_cast<std::size_t>(n);
  const std::size_t nn = N * N;
  grads.assign(static_cast<std::size_t>(op.nargs), {});
  const auto& x = in[0];
  switch (op.id) {
    case OpId::add:
      out.resize(nn);
      for (std::size_t i = 0; i < nn; ++i) out[i] = x[i] + in[1][i];
      grads[0] = g;
      grads[1] = g;
      break;
    case OpId::mul:
      out.resize(nn);
      grads[0].resize(nn);
      grads[1].resize(nn);
      for (std::size_t i = 0; i < nn; ++i) {
        out[i] = x[i] * in[1][i];
        grads[0][i] = g[i] * in[1][i];
        grads[1][i] = g[i] * x[i];
      }
      break;
    case OpId::transpose:
      out.resize(nn);
      grads[0].resize(nn);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[j * N + i] = x[i * N + j];
          grads[0][i * N + j] = g[j * N + i];
        }
      break;
    case OpId::pow:
      out.resize(nn);
      grads[0].resize(nn);
      grads[1].resize(nn);
      for (std::size_t i = 0; i < nn; ++i) {
        const double b = x[i], e = in[1][i];
        out[i] = std::pow(b, e);
        grads[0][i] = g[i] * e * std::pow(b, e - 1);
        grads[1][i] = g[i] * out[i] * std::log(b);
      }
      break;
    case OpId::broadcast:
      out.resize(nn);
      grads[1].assign(N, 0.0);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[i * N + j] = x[i * N + j] + in[1][j];
          grads[1][j] += g[i * N + j];
        }
      grads[0] = g;
      break;
    case OpId::sum: {
      double s = 0;
      for (double v : x) s += v;
      out.assign(1, s);
      grads[0].assign(nn, g[0]);
      break;
    }
    case OpId::sum_axis1:
      out.assign(N, 0.0);
      grads[0].resize(nn);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[i] += x[i * N + j];
          grads[0][i * N + j] = g[i];
        }
      break;
    case OpId::matmul: {
      const auto& a = x;
      const auto& b = in[1];
      out.assign(nn, 0.0);
      grads[0].assign(nn, 0.0);
      grads[1].assign(nn, 0.0);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t k = 0; k < N; ++k) {
          const double aik = a[i * N + k];
          double da = 0;  // dA = G B^T
          for (std::size_t j = 0; j < N; ++j) {
            out[i * N + j] += aik * b[k * N + j];
            da += g[i * N + j] * b[k * N + j];
            grads[1][k * N + j] += aik * g[i * N + j];  // dB = A^T G
          }
          grads[0][i * N + k] = da;
        }
      break;
    }
  }
}

Check check_against_float64(const OpSpec& op, std::int64_t n, const RunResult& cpu) {
  std::vector<std::vector<double>> in;
  for (const auto& t : cpu.inputs) in.push_back(t.to_vector<double>());
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
  reference(op, n, in, cpu.seed.to_vector<double>(), out, grads);
  Check c;
  c.op = op.name;
  c.n = n;
  c.device = "cpu";
  c.against = "float64";
  c.tol = kTolVsFloat64;
  c.err = host_error(cpu.out.to_vector<double>(), out, op.metric);
  c.worst = "out";
  for (int k = 0; k < op.nargs; ++k) {
    const double e = host_error(cpu.grads[static_cast<std::size_t>(k)].to_vector<double>(),
                                grads[static_cast<std::size_t>(k)], op.metric);
    if (std::isnan(e) || e > c.err) {
      c.err = e;
      c.worst = std::string("d") + op.arg[k];
    }
    if (std::isnan(e)) break;
  }
  c.passed = c.err <= c.tol;
  return c;
}

Check check_against_cpu(const OpSpec& op, std::int64_t n, const RunResult& got, const RunResult& cpu,
                        Device device) {
  Check c;
  c.op = op.name;
  c.n = n;
  c.device = device.str();
  c.against = "cpu";
  c.tol = kTolGpuVsCpu;
  c.err = max_error(got.out, cpu.out.to(device), op.metric);
  c.worst = "out";
  for (int k = 0; k < op.nargs && !std::isnan(c.err); ++k) {
    const auto i = static_cast<std::size_t>(k);
    const double e = max_error(got.grads[i], cpu.grads[i].to(device), op.metric);
    if (std::isnan(e) || e > c.err) {
      c.err = e;
      c.worst = std::string("d") + op.arg[k];
    }
  }
  c.passed = c.err <= c.tol;
  return c;
}

}  // namespace opsbench
