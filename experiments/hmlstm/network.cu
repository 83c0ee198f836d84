// network.cu: the 3-layer HM-LSTM of experiments/peers/MODEL.md on dualcast (see network.hpp).
//
// Compiled by nvcc in CUDA builds (the two mixed-mode functors then run as fused GPU kernels) and as
// plain C++ otherwise. Timing and the captured step live in captured.cu.
#include "network.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "dualcast/broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/precision.hpp"
#include "dualcast/random.hpp"

#include "../common/json.hpp"
#include "gates.hpp"


namespace hmlstm {

using namespace dualcast;
using dcexp::json;

// =================================================================================================
// The elementwise step, reverse mode: the same math in select form on Vars (one kernel and one tape
// node per primitive), as the peers' hm_pointwise / cell_b.
// =================================================================================================

std::pair<Var, Var> reverse_cell(const Tensor& zflag, const Tensor& zbflag, const Var& c, const Var& h,
                                 const Var& f, const Var& i, const Var& o, const Var& g) {
  return HmCellSelect{}(zflag, zbflag, c, h, f, i, o, g);
}

namespace {
template <class Slope>
Var reverse_boundary_impl(const Var& sz, const Slope& a, bool soft) {
  const Var u = (sz * a + 1.0) * 0.5;
  const Tensor interior = logical_and(u > 0.0, u < 1.0);
  const Tensor at_top = u >= 1.0;
  const Var zt = select(at_top, 1.0, select(interior, u, 0.0));
  if (soft) return zt;
  const Tensor step = (zt.value() > 0.5).to(zt.dtype());
  return zt + (step - zt.value());  // value: step exactly; gradient: that of zt (STE)
}
}  // namespace

Var reverse_boundary(const Var& sz, double a, bool soft) { return reverse_boundary_impl(sz, a, soft); }
Var reverse_boundary(const Var& sz, const Tensor& a, bool soft) {
  return reverse_boundary_impl(sz, Var(a), soft);
}

namespace {

const std::array<const char*, 14> kParamNames = {"E",  "W1", "U1", "b1",  "Td1", "W2",   "U2",
                                                 "b2", "Td2", "W3", "U3", "b3",  "Wout", "bout"};
// Indices into params_.
constexpr int kE = 0, kWout = 12, kBout = 13;
constexpr std::array<int, 3> kW = {1, 5, 9}, kU = {2, 6, 10}, kB = {3, 7, 11};
constexpr std::array<int, 2> kTd = {4, 8};

std::uint64_t param_seed(std::uint64_t seed, int index) {
  return seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * static_cast<std::uint64_t>(index + 1);
}

}  // namespace

// =================================================================================================
// HmlstmNetwork
// =================================================================================================

const char* cell_mode_name(CellMode mode) { return mode == CellMode::mixed ? "mixed" : "reverse"; }

CellMode parse_cell_mode(const std::string& name) {
  if (name == "mixed") return CellMode::mixed;
  if (name == "reverse") return CellMode::reverse;
  DUALCAST_FAIL("hmlstm: unknown cell mode '", name, "' (expected mixed or reverse)");
}

HmlstmNetwork::HmlstmNetwork(const NetworkConfig& config) : config_(config) {
  DUALCAST_CHECK(config.layers == 3, "HmlstmNetwork: layers = ", config.layers,
                 " unsupported (MODEL.md fixes L = 3)");
  DUALCAST_CHECK(config.hidden > 0 && config.vocab > 0 && config.batch > 0 && config.seq > 0,
                 "HmlstmNetwork: hidden, vocab, batch and seq must be positive (got H=", config.hidden,
                 " V=", config.vocab, " B=", config.batch, " T=", config.seq, ")");
  DUALCAST_CHECK(is_floating(config.dtype), "HmlstmNetwork: dtype must be float32 or float64");
  DUALCAST_CHECK(config.autocast == DType::float32 ||
                     (dualcast::is_half(config.autocast) && config.dtype == DType::float32 && config.stacked_weight_grad),
                 "HmlstmNetwork: autocast ", dtype_name(config.autocast), " with dtype ", dtype_name(config.dtype),
                 config.stacked_weight_grad ? "" : " and unstacked gates",
                 ": Autocast needs a float32 network with stacked gates (autocast bfloat16 or float16)");
  const std::int64_t H = config.hidden, V = config.vocab, G = 4 * H + 1;
  const Device d = config.device;
  const DType t = config.dtype;
  const double r = 1.0 / std::sqrt(static_cast<double>(H));
  params_.resize(kParamNames.size());
  auto uni = [&](int idx, const Shape& s) {
    params_[static_cast<std::size_t>(idx)] = Var::param(Tensor::uniform(s, d, param_seed(config.seed, idx), -r, r, t));
  };
  params_[kE] = Var::param(Tensor::randn({V, H}, d, param_seed(config.seed, kE), t));
  for (int l = 0; l < 3; ++l) {
    uni(kW[l], {H, G});
    uni(kU[l], {H, G});
    params_[static_cast<std::size_t>(kB[l])] = Var::param(Tensor::zeros({G}, t, d));
    if (l < 2) uni(kTd[l], {H, G});
  }
  uni(kWout, {3 * H, V});
  params_[kBout] = Var::param(Tensor::zeros({V}, t, d));
  slope_ = Tensor::full({1, 1}, static_cast<double>(config.slope), t, d);
}

void HmlstmNetwork::set_slope(float slope) {
  if (slope == config_.slope) return;
  detail::check_not_capturing(config_.device, "HmlstmNetwork::set_slope with a new value (the slope "
                                              "is a device scalar the captured step reads; set it "
                                              "between replays)");
  slope_.fill_(static_cast<double>(slope));
  config_.slope = slope;
}

std::vector<std::string> HmlstmNetwork::param_names() const {
  return {kParamNames.begin(), kParamNames.end()};
}

Var& HmlstmNetwork::param(const std::string& name) {
  for (std::size_t k = 0; k < kParamNames.size(); ++k)
    if (name == kParamNames[k]) return params_[k];
  DUALCAST_FAIL("HmlstmNetwork::param: no parameter named '", name, "'");
}

void HmlstmNetwork::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

void HmlstmNetwork::sgd_step(float lr) {
  if (!sgd_) sgd_ = std::make_unique<optim::SGD>(params_, lr);
  else sgd_->set_lr(lr);
  sgd_->step();
  zero_grad();
}

void HmlstmNetwork::load_params_from(const HmlstmNetwork& other) {
  DUALCAST_CHECK(other.params_.size() == params_.size(), "load_params_from: parameter count differs");
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const Tensor& src = other.params_[k].value();
    const Tensor& dst = params_[k].value();
    DUALCAST_CHECK(src.shape() == dst.shape(), "load_params_from: parameter ", kParamNames[k],
                   " has shape ", src.shape().str(), " there and ", dst.shape().str(), " here");
    Tensor converted = src.to(dst.dtype());
    Tensor(dst).copy_(converted);
  }
}

Var HmlstmNetwork::loss(const Tensor& tokens_in) {
  check_defined(tokens_in, "HmlstmNetwork::loss", "tokens");
  DUALCAST_CHECK(tokens_in.rank() == 2 && tokens_in.shape()[0] >= 2 && tokens_in.shape()[1] >= 1,
                 "HmlstmNetwork::loss: tokens must be [T+1, B] with T >= 1, B >= 1; got ",
                 tokens_in.shape().str());
  DUALCAST_CHECK(is_floating(tokens_in.dtype()), "HmlstmNetwork::loss: tokens must hold float ids");
  const std::int64_t T = tokens_in.shape()[0] - 1, B = tokens_in.shape()[1];
  const std::int64_t H = config_.hidden, V = config_.vocab;
  const Device dev = config_.device;
  const DType dt = config_.dtype;
  if (tokens_in.device().is_cpu()) {
    for (double x : tokens_in.to_vector<double>())
      DUALCAST_CHECK(x >= 0 && x < static_cast<double>(V) && x == std::floor(x),
                     "HmlstmNetwork::loss: token id ", x, " is not an integer in [0, ", V, ")");
  }
  const Tensor tok = tokens_in.to(dev).to(dt);
  const Tensor classes = Tensor::arange(V, dt, dev);
  const Tensor in_ids = reshape(slice(tok, 0, 0, T), {T * B, std::int64_t{1}});
  const Tensor tgt_ids = reshape(slice(tok, 0, 1, T + 1), {T * B});
  const Tensor onehot_in = (in_ids == classes).to(dt);  // [T*B, V]

  auto P = [&](int idx) -> const Var& { return params_[static_cast<std::size_t>(idx)]; };
  std::optional<dualcast::Autocast> autocast;  // NetworkConfig::autocast: the products in 16 bits
  if (dualcast::is_half(config_.autocast)) autocast.emplace(config_.autocast);
  // h^0_t = E[x_t] as a one-hot product: its gradient onehot^T @ dh is the scatter-add of rows.
  Var emb = matmul(Var(onehot_in), P(kE));  // [T*B, H]
  if (emb.dtype() != dt) emb = cast(emb, dt);  // under Autocast: the layers read float32
  const std::vector<Var> embs = split(emb, 0, std::vector<std::int64_t>(static_cast<std::size_t>(T), B));

  const Tensor zeros_bh = Tensor::zeros({B, H}, dt, dev);
  const Tensor zeros_b1 = Tensor::zeros({B, 1}, dt, dev);
  const Tensor ones_b1 = Tensor::ones({B, 1}, dt, dev);
  std::array<Var, 3> c{Var(zeros_bh), Var(zeros_bh), Var(zeros_bh)};
  std::array<Var, 3> h = c;
  std::array<Var, 3> z{Var(zeros_b1), Var(zeros_b1), Var(zeros_b1)};
  std::array<std::vector<Var>, 3> hs;  // h^l_t for every t, per layer
  for (auto& v : hs) v.reserve(static_cast<std::size_t>(T));
  last_z_prev_.clear();
  last_zb_.clear();
  last_z_new_.clear();

  // The 0/1 flag of a boundary: z itself in STE mode (exactly 0 or 1), step(z~) with soft_boundary.
  auto flag_of = [&](const Var& zv) -> Tensor {
    if (!config_.soft_boundary) return zv.value();
    return (zv.value() > 0.5).to(dt);
  };
  const std::vector<std::int64_t> gate_sizes = {H, H, H, H, 1};
  // For t > 0 the three gate products of a layer are one matmul: [zb*h_below, h, z*h_above] @
  // [W; U; Td]. Row scaling by the 0/1 flags commutes with the product, so this is the same s (and the
  // same gradients) with one cuBLAS call instead of three and no adds: about a third fewer kernels
  // and tape nodes per layer and step, which is what bounds the step (it is host-bound).
  const bool stacked = config_.stacked_weight_grad;
  // The fused layer-step (gates.hpp, LayerGates::cell_step) computes the partials again in the
  // backward: it serves mixed mode unless the partials are to be stored.
  const bool fused = stacked && config_.fused_cell && config_.mode == CellMode::mixed &&
                     config_.partials != dualcast::Partials::store;
  std::array<Var, 3> wcat;
  std::vector<LayerGates> layer_gates;  // stacked: created before the time loop (gates.hpp)
  if (stacked) {
    layer_gates.reserve(3);
    for (int l = 0; l < 3; ++l)
      layer_gates.emplace_back(stacked_gate_weights(P(kW[l]), P(kU[l]), l < 2 ? P(kTd[l]) : Var(), P(kB[l])),
                               T, B, H, l < 2);
  } else if (T > 1) {
    for (int l = 0; l < 3; ++l)
      wcat[l] = l < 2 ? concat({P(kW[l]), P(kU[l]), P(kTd[l])}, 0) : concat({P(kW[l]), P(kU[l])}, 0);
  }
  for (std::int64_t t = 0; t < T; ++t) {
    std::array<Var, 3> nc, nh, nz;
    for (int l = 0; l < 3; ++l) {
      // s = zb * (h^{l-1}_t @ W) + h^l_{t-1} @ U + z^l_{t-1} * (h^{l+1}_{t-1} @ Td) + b.
      const Var& below = l == 0 ? embs[static_cast<std::size_t>(t)] : nh[l - 1];
      const Tensor zflag = flag_of(z[l]);
      const Tensor zbflag = l == 0 ? ones_b1 : flag_of(nz[l - 1]);
      if (fused) {
        // Mixed mode, recomputed partials: the gates, the cell and the boundary detector of the
        // layer-step in one node, 3 kernels forward and 3 backward instead of 5 and 5 (gates.hpp).
        // Its kernel also writes the gate inputs of the layer-step after it: the layer above at
        // this step (bottom-up: this cell's h' and z'), or after the top layer layer 0 at the next
        // step (whose inputs all exist by now), which then runs no gate-input kernel.
        NextInputs next;
        if (config_.cell_writes_next_inputs && l < 2) {
          next = {&layer_gates[static_cast<std::size_t>(l) + 1], t, true, Var(), Var(), h[l + 1],
                  l + 1 < 2 ? z[l + 1] : Var(), l + 1 < 2 ? h[l + 2] : Var()};
        } else if (config_.cell_writes_next_inputs && t + 1 < T) {
          next = {&layer_gates[0], t + 1, false, embs[static_cast<std::size_t>(t) + 1], Var(), nh[0], nz[0], nh[1]};
        }
        const std::vector<Var> out = layer_gates[static_cast<std::size_t>(l)].cell_step(
            t, below, l > 0 ? nz[l - 1] : Var(), h[l], l < 2 ? z[l] : Var(), l < 2 ? h[l + 1] : Var(), c[l], zflag,
            l == 0 ? Tensor() : zbflag, slope_, config_.soft_boundary, next);
        nc[l] = out[0];
        nh[l] = out[1];
        nz[l] = out[2];
      } else {
        std::vector<Var> gates;  // f, i, o, g, s_z
        if (stacked) {
          gates = layer_gates[static_cast<std::size_t>(l)].step(t, below, l > 0 ? nz[l - 1] : Var(), h[l],
                                                                l < 2 ? z[l] : Var(), l < 2 ? h[l + 1] : Var());
        } else {
          // At t = 0 the state is zero, so the U and Td terms are exactly zero (and so are their
          // contributions to the gradients): they are skipped.
          Var s;
          if (t == 0) {
            s = matmul(below, P(kW[l]));
            if (l > 0) s = nz[l - 1] * s;
          } else {
            std::vector<Var> x{l > 0 ? nz[l - 1] * below : below, h[l]};
            if (l < 2) x.push_back(z[l] * h[l + 1]);
            s = matmul(concat(x, 1), wcat[l]);
          }
          s = s + P(kB[l]);
          gates = split(s, 1, gate_sizes);
        }
        if (config_.mode == CellMode::mixed) {
          if (l == 0) {
            auto [cn, hn] = broadcast(config_.partials, HmCell{}, zflag, 1.0, c[l], h[l], gates[0],
                                      gates[1], gates[2], gates[3]);
            nc[l] = cn;
            nh[l] = hn;
          } else {
            auto [cn, hn] = broadcast(config_.partials, HmCell{}, zflag, zbflag, c[l], h[l], gates[0],
                                      gates[1], gates[2], gates[3]);
            nc[l] = cn;
            nh[l] = hn;
          }
          nz[l] = config_.soft_boundary ? broadcast(config_.partials, BoundarySoft{}, gates[4], slope_)
                                        : broadcast(config_.partials, BoundarySte{}, gates[4], slope_);
        } else {
          auto [cn, hn] = reverse_cell(zflag, zbflag, c[l], h[l], gates[0], gates[1], gates[2], gates[3]);
          nc[l] = cn;
          nh[l] = hn;
          nz[l] = reverse_boundary(gates[4], slope_, config_.soft_boundary);
        }
      }
      last_z_prev_.push_back(zflag);
      last_zb_.push_back(l == 0 ? Tensor() : zbflag);
      last_z_new_.push_back(nz[l].value());
      hs[static_cast<std::size_t>(l)].push_back(nh[l]);
    }
    // The layer above read h^{l+1}_{t-1}, z^l_{t-1} before they are replaced here.
    c = nc;
    h = nh;
    z = nz;
  }

  const Var hcat = concat({concat(hs[0], 0), concat(hs[1], 0), concat(hs[2], 0)}, 1);  // [T*B, 3H]
  const Var logits = matmul(hcat, P(kWout)) + P(kBout);                                // [T*B, V]
  // Mean softmax cross-entropy in nats (dualcast's fused kernel; it checks the labels, one sync).
  return cross_entropy(logits, tgt_ids);
}

BoundaryStats HmlstmNetwork::boundary_stats() const {
  BoundaryStats st;
  st.flush.assign(3, 0);
  st.copy.assign(3, 0);
  st.update.assign(3, 0);
  st.z1.assign(3, 0);
  for (std::size_t k = 0; k < last_z_prev_.size(); ++k) {
    const int l = static_cast<int>(k % 3);
    const auto zp = last_z_prev_[k].to_vector<double>();
    const auto zn = last_z_new_[k].to_vector<double>();
    std::vector<double> zb(zp.size(), 1.0);
    if (last_zb_[k].defined()) zb = last_zb_[k].to_vector<double>();
    for (std::size_t b = 0; b < zp.size(); ++b) {
      if (zp[b] == 1) ++st.flush[l];
      else if (zb[b] == 0) ++st.copy[l];
      else ++st.update[l];
      if (zn[b] > 0.5) ++st.z1[l];
    }
  }
  return st;
}

std::vector<std::uint8_t> HmlstmNetwork::boundary_flags() const {
  std::vector<std::uint8_t> flags;
  for (const Tensor& zn : last_z_new_)
    for (double v : zn.to_vector<double>()) flags.push_back(v > 0.5 ? 1 : 0);
  return flags;
}

double HmlstmNetwork::min_boundary_margin() const {
  double m = 0.5;
  for (const Tensor& zn : last_z_new_)
    for (double v : zn.to_vector<double>()) m = std::min(m, std::fabs(v - 0.5));
  return m;
}

// =================================================================================================
// tokens, mode comparison, timing
// =================================================================================================

Tensor random_tokens(int seq, int batch, int vocab, std::uint64_t seed) {
  DUALCAST_CHECK(seq >= 1 && batch >= 1 && vocab >= 1, "random_tokens: seq, batch, vocab must be >= 1");
  const std::size_t n = static_cast<std::size_t>(seq + 1) * static_cast<std::size_t>(batch);
  std::vector<float> ids(n);
  for (std::size_t j = 0; j < n; ++j) {
    const double u = random::uniform(seed, j);  // (0, 1]
    ids[j] = static_cast<float>(std::min(vocab - 1, static_cast<int>(std::floor(u * vocab))));
  }
  return Tensor::from_vector({seq + 1, batch}, ids);
}

double float32_products_tolerance(double exact, DType autocast) {
  if (autocast == DType::bfloat16) return std::max(exact, 5e-2);
  if (autocast == DType::float16) return std::max(exact, 1e-2);
  switch (dualcast::detail::float32_precision()) {
    case dualcast::detail::Float32Precision::high: return std::max(exact, 1e-2);    // TF32 products
    case dualcast::detail::Float32Precision::medium: return std::max(exact, 5e-2);  // bfloat16 products
    default: return exact;
  }
}

ModeComparison compare_modes(const NetworkConfig& config, const Tensor& tokens, double tolerance) {
  ModeComparison r;
  r.tolerance = tolerance > 0 ? tolerance : (config.dtype == DType::float64 ? 1e-10 : float32_products_tolerance(1e-3, config.autocast));
  NetworkConfig cm = config, cr = config;
  cm.mode = CellMode::mixed;
  cr.mode = CellMode::reverse;
  HmlstmNetwork mixed(cm), reverse(cr);
  reverse.load_params_from(mixed);
  Var lm = mixed.loss(tokens);
  lm.backward();
  Var lr = reverse.loss(tokens);
  lr.backward();
  r.loss_mixed = lm.item();
  r.loss_reverse = lr.item();
  r.loss_rel_err = std::fabs(r.loss_mixed - r.loss_reverse) / std::max(std::fabs(r.loss_reverse), 1e-300);
  if (!std::isfinite(r.loss_mixed)) r.loss_rel_err = INFINITY;
  const auto names = mixed.param_names();
  for (std::size_t k = 0; k < names.size(); ++k) {
    const Var& pm = mixed.params()[k];
    const Var& pr = reverse.params()[k];
    double err;
    if (!pm.has_grad() || !pr.has_grad()) err = (pm.has_grad() == pr.has_grad()) ? 0.0 : INFINITY;
    else err = dualcast::array_error(pm.grad(), pr.grad(), dualcast::ErrorScale::largest);
    if (err > r.max_grad_rel_err || r.worst_param.empty()) {
      r.max_grad_rel_err = std::max(r.max_grad_rel_err, err);
      r.worst_param = names[k];
    }
  }
  const BoundaryStats sm = mixed.boundary_stats(), sr = reverse.boundary_stats();
  r.same_boundaries = sm.flush == sr.flush && sm.copy == sr.copy && sm.update == sr.update && sm.z1 == sr.z1;
  r.ok = r.loss_rel_err <= r.tolerance && r.max_grad_rel_err <= r.tolerance;
  std::ostringstream os;
  os << "mixed vs reverse (H=" << config.hidden << " B=" << tokens.shape()[1]
     << " T=" << tokens.shape()[0] - 1 << " " << dtype_name(config.dtype) << " " << config.device.str()
     << "): loss " << r.loss_mixed << " vs " << r.loss_reverse << " (rel err " << r.loss_rel_err
     << "), worst gradient rel err " << r.max_grad_rel_err << " (" << r.worst_param << "), tolerance "
     << r.tolerance << (r.same_boundaries ? "" : "; the modes took DIFFERENT boundary decisions")
     << (r.ok ? ": ok" : ": FAILED");
  r.message = os.str();
  return r;
}

// =================================================================================================
// validation directory (experiments/peers/valdir.py format)
// =================================================================================================

namespace {

template <class T>
void write_raw(const std::filesystem::path& file, const std::vector<T>& data) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  DUALCAST_CHECK(out.good(), "write_validation: cannot open ", file.string(), " for writing");
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  DUALCAST_CHECK(out.good(), "write_validation: writing ", file.string(), " failed");
}

json shape_json(const Shape& s) {
  json a = json::array();
  for (int d = 0; d < s.rank(); ++d) a.push_back(s[d]);
  return a;
}

}  // namespace

void write_validation(const std::string& dir, const NetworkConfig& config) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  DUALCAST_CHECK(fs::is_directory(root), "write_validation: cannot create directory ", dir,
                 ec ? " (" + ec.message() + ")" : std::string());

  HmlstmNetwork net(config);
  // The peers read float32 parameters: compute at exactly those values.
  for (auto& p : net.params()) Tensor(p.value()).copy_(p.value().to(DType::float32).to(p.dtype()));
  // A float64 twin at the same parameters: token batches on which some boundary decision differs
  // between float32 and float64 are skipped (up to 16 tries). Such a decision lies within rounding
  // of z~ = 0.5 (typically 0 < a s_z < 2^-24, where fp32 rounds u to exactly 0.5), and another fp32
  // implementation could take it either way; MODEL.md's validation caveat.
  NetworkConfig c64 = config;
  c64.dtype = DType::float64;
  HmlstmNetwork twin(c64);
  twin.load_params_from(net);
  Tensor tokens;
  std::uint64_t token_seed = config.seed + 1000;
  bool decisions_agree = false;
  for (int attempt = 0; attempt < 16 && !decisions_agree; ++attempt) {
    token_seed = config.seed + 1000 + static_cast<std::uint64_t>(attempt);
    tokens = random_tokens(config.seq, config.batch, config.vocab, token_seed);
    NoGradGuard no_grad;
    (void)net.loss(tokens);
    (void)twin.loss(tokens);
    decisions_agree = net.boundary_flags() == twin.boundary_flags();
  }
  Var loss = net.loss(tokens);
  loss.backward();
  const double loss_value = loss.item();

  // An existing manifest is merged: its other entries are written back with the same values (every
  // double round-trips; a NaN Python wrote comes back as null, which valdir.py reads as NaN).
  json manifest = json::object();
  const fs::path mpath = root / "manifest.json";
  if (fs::exists(mpath)) {
    try {
      manifest = dcexp::read_json_file(mpath.string());
    } catch (const std::runtime_error& e) {
      DUALCAST_FAIL("write_validation: ", e.what());
    }
    DUALCAST_CHECK(manifest.is_object(), mpath.string(), ": top level must be an object");
  }
  manifest["arrays"];  // create both first: operator[] may reallocate the member list
  manifest["scalars"];
  json& arrays = manifest["arrays"];
  json& scalars = manifest["scalars"];
  if (!arrays.is_object()) arrays = json::object();
  if (!scalars.is_object()) scalars = json::object();

  auto put_array = [&](const std::string& name, const Shape& shape, const char* dtype) {
    json meta = json::object();
    meta["file"] = name + ".bin";
    meta["shape"] = shape_json(shape);
    meta["dtype"] = dtype;
    arrays[name] = meta;
  };

  {
    const auto ids = tokens.to_vector<double>();
    std::vector<std::int32_t> v(ids.size());
    for (std::size_t j = 0; j < ids.size(); ++j) v[j] = static_cast<std::int32_t>(ids[j]);
    write_raw(root / "e_tokens.bin", v);
    put_array("e_tokens", tokens.shape(), "int32");
  }
  const auto names = net.param_names();
  for (std::size_t k = 0; k < names.size(); ++k) {
    const Var& p = net.params()[k];
    const std::string name = "e_" + names[k];
    write_raw(root / (name + ".bin"), p.value().to_vector<float>());
    put_array(name, p.shape(), "float32");
    const double gn = p.has_grad() ? norm(p.grad()) : 0.0;
    scalars["e_gradnorm_" + names[k]] = gn;
  }
  // Doubles keep every digit (a whole one is written as 1.0, as Python's float); a non-finite loss or
  // norm is written as null, which valdir.py reads as NaN, a failure.
  scalars["e_loss"] = loss_value;
  scalars["e_slope"] = static_cast<double>(config.slope);
  scalars["e_H"] = config.hidden;
  scalars["e_B"] = config.batch;
  scalars["e_T"] = config.seq;
  // Extras (ignored by valdir.py): the token seed used, and whether float32 and float64 took the
  // same boundary decisions there (1) or no such batch was found in 16 tries (0).
  scalars["e_token_seed"] = token_seed;
  scalars["e_boundaries_fp64_agree"] = decisions_agree ? 1 : 0;

  try {
    dcexp::write_json_file(mpath.string(), manifest);  // through manifest.json.tmp, then renamed
  } catch (const std::runtime_error& e) {
    DUALCAST_FAIL("write_validation: ", e.what());
  }
}

}  // namespace hmlstm
