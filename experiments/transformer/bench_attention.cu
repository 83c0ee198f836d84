// bench_attention.cu: attention_bench, scaled_dot_product_attention forward and forward+backward,
// dualcast fused vs dualcast composed vs PyTorch's scaled_dot_product_attention (peer_torch.py), on
// the same GPU in the same run, float32 (no TF32 anywhere). Every configuration is validated before
// it is timed: fused against composed on the same inputs (outputs and all three gradients), and the
// peer against dualcast's dumped results. Writes results.json, results.csv and a table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/gpu_timing.hpp"
#include "common/json.hpp"
#include "common/precision.hpp"
#include "common/report.hpp"
#include "common/text.hpp"
#include "driver_util.hpp"
#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/attention.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/tape.hpp"

namespace {

using dcexp::json;
using dcexp::fmt;
using dualcast::AttentionImpl;
using dualcast::AttentionOptions;
using dualcast::Device;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;
using transformer::driver::positive;
using transformer::driver::split_csv;

constexpr const char* kUsage = R"(usage: attention_bench [options]

scaled_dot_product_attention forward and forward+backward ([batch, heads, seq, head_dim]):
dualcast's fused kernels vs its composed version (matmul, masked softmax, matmul) vs PyTorch's
torch.nn.functional.scaled_dot_product_attention, validated first, timed with CUDA events.

Options:
  --device auto|cpu|cuda   default auto (the CPU runs the composed version only, at small sizes)
  --seqs LIST              sequence lengths (GPU default 128,256,512,1024,2048,4096; CPU 64,128)
  --heads N --head-dim N   default 8 and 64
  --tokens N               batch = max(1, tokens / seq) (GPU default 32768, CPU 256)
  --causal LIST            0 (no mask), 1 (causal) or both (default 0,1)
  --reps N --warmup N      timed and untimed repetitions (GPU default 30 and 5; CPU 3 and 1)
  --precision fp32|bf16|fp16  the dtype of q, k, v (default fp32: float32, SIMT kernels, no TF32;
                           bf16/fp16: 16-bit tensors on the tensor-core kernels, and PyTorch's SDPA
                           on the same dtype); tf32 is fp32 here (attention has no TF32 mode)
  --fwd-tm LIST            float32 head_dim-64 forward tile heights to time: 0 (the library's
                           choice, recorded as dualcast_fused), 4 (64 query rows per block,
                           dualcast_fused_tm4) and/or 8 (128 rows, dualcast_fused_tm8) (default 0)
  --peers                  time PyTorch too (peer_torch.py attention), validated against dualcast
  --python PATH            interpreter for the peer (default: the first python3 with torch)
  --out DIR                output folder (default results/attention)
  --help                   this text

Exit status: 0 done; 2 bad usage; 4 a validation failed; 1 any other error.
)";

struct Options {
  std::string device = "auto";
  std::vector<long long> seqs;
  int heads = 8, head_dim = 64;
  long long tokens = -1;
  std::vector<long long> causal{0, 1};
  int reps = -1, warmup = -1;
  std::vector<long long> fwd_tm{0};
  dcexp::Precision precision = dcexp::Precision::fp32;
  bool peers = false;
  std::string python;
  std::string out = "results/attention";
};

Options parse(int argc, char** argv) {
  Options o;
  dcexp::cli::ArgWalker args(argc, argv);
  auto list = [&](const std::string& opt, const std::string& v, bool zero) {
    std::vector<long long> r;
    for (const auto& s : split_csv(v)) r.push_back(positive(opt, s, zero));
    if (r.empty()) throw dcexp::cli::UsageError(opt + ": empty list");
    return r;
  };
  while (args.next()) {
    const std::string& a = args.option();
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--device") o.device = args.value();
    else if (a == "--seqs") o.seqs = list(a, args.value(), false);
    else if (a == "--heads") o.heads = static_cast<int>(positive(a, args.value()));
    else if (a == "--head-dim") o.head_dim = static_cast<int>(positive(a, args.value()));
    else if (a == "--tokens") o.tokens = positive(a, args.value());
    else if (a == "--causal") {
      o.causal = list(a, args.value(), true);
      for (long long c : o.causal)
        if (c > 1) throw dcexp::cli::UsageError("--causal: entries are 0 or 1");
    } else if (a == "--fwd-tm") {
      o.fwd_tm = list(a, args.value(), true);
      for (long long t : o.fwd_tm)
        if (t != 0 && t != 4 && t != 8) throw dcexp::cli::UsageError("--fwd-tm: entries are 0, 4 or 8");
    } else if (a == "--precision") o.precision = dcexp::cli::parse_precision(args.value());
    else if (a == "--reps") o.reps = static_cast<int>(positive(a, args.value()));
    else if (a == "--warmup") o.warmup = static_cast<int>(positive(a, args.value(), true));
    else if (a == "--peers") {
      args.no_value();
      o.peers = true;
    } else if (a == "--python") o.python = args.value();
    else if (a == "--out") o.out = args.value();
    else throw dcexp::cli::UsageError("unknown option " + a + " (see --help)");
  }
  return o;
}

/// The dtype of q, k, v at a precision (attention has no TF32 mode: tf32 runs float32).
dualcast::DType input_dtype(dcexp::Precision p) {
  return dcexp::is_autocast(p) ? dcexp::autocast_dtype(p) : dualcast::DType::float32;
}

/// Largest fused-vs-composed difference accepted before timing (ErrorScale::largest). float32: the
/// same sums in another order. 16-bit: the tensor-core kernels round P and dS to 16 bits, the
/// composed path runs on float32 copies and rounds once (test_attention_tensor_core.cu's tolerances
/// against float64, twice over).
double validation_tol(dualcast::DType dt) {
  return dt == dualcast::DType::bfloat16 ? 4e-2 : (dt == dualcast::DType::float16 ? 5e-3 : 1e-4);
}

struct Grads {
  Tensor out, dq, dk, dv;
};
Grads run_once(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const AttentionOptions& o) {
  Var vq = Var::param(q), vk = Var::param(k), vv = Var::param(v);
  const Var out = dualcast::scaled_dot_product_attention(vq, vk, vv, o);
  out.backward(g);
  return {out.value(), vq.grad(), vk.grad(), vv.grad()};
}

/// Raw little-endian float32 arrays plus manifest.json (experiments/peers' format).
void dump(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& arrays, json& manifest) {
  json& meta = manifest["arrays"];
  if (!meta.is_object()) meta = json::object();
  for (const auto& [name, t] : arrays) {
    const std::vector<float> v = t.to_vector<float>();
    std::ofstream f(dir + "/" + name + ".bin", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    DUALCAST_CHECK(f.good(), "attention_bench: cannot write ", dir, "/", name, ".bin");
    json m = json::object(), sh = json::array();
    for (int i = 0; i < t.rank(); ++i) sh.push_back(static_cast<long long>(t.shape()[i]));
    m["file"] = name + ".bin";
    m["shape"] = sh;
    m["dtype"] = "float32";
    meta[name] = m;
  }
}

int run(const Options& o) {
  const Device dev = transformer::driver::pick_device(o.device);
  const bool gpu = dev.is_cuda();
  const std::vector<long long> seqs =
      !o.seqs.empty() ? o.seqs : (gpu ? std::vector<long long>{128, 256, 512, 1024, 2048, 4096} : std::vector<long long>{64, 128});
  const long long tokens = o.tokens > 0 ? o.tokens : (gpu ? 32768 : 256);
  const int reps = o.reps > 0 ? o.reps : (gpu ? 30 : 3);
  const int warmup = o.warmup >= 0 ? o.warmup : (gpu ? 5 : 1);
  const std::int64_t H = o.heads, D = o.head_dim;
  const dualcast::DType dt = input_dtype(o.precision);
  const char* prec = dcexp::precision_name(o.precision == dcexp::Precision::tf32 ? dcexp::Precision::fp32 : o.precision);
  std::filesystem::create_directories(o.out);
  std::cerr << "attention_bench on " << dualcast::device_name(dev) << ": heads " << H << ", head_dim " << D
            << ", " << tokens << " tokens per batch, " << dualcast::dtype_name(dt) << "\n";

  json root = json::object(), meta = json::object();
  meta["time"] = dcexp::iso_time();
  meta["device"] = dualcast::device_name(dev);
  meta["heads"] = static_cast<int>(H);
  meta["head_dim"] = static_cast<int>(D);
  meta["tokens"] = tokens;
  meta["reps"] = reps;
  meta["precision"] = prec;
  meta["dtype"] = dualcast::dtype_name(dt);
  meta["flops"] = "fwd 4 B H S^2 D, fwd+bwd 14 B H S^2 D (FlashAttention's count), halved when causal";
  root["meta"] = meta;
  json records = json::array();

  // ---- validation data for the peer: S = 256, B = 2, both mask settings --------------------------
  const std::string valdir = o.out + "/validate";
  json manifest = json::object();
  if (o.peers) std::filesystem::create_directories(valdir);

  for (long long S : seqs)
    for (long long causal : o.causal) {
      // Every size allocates other block sizes: hand the cached ones back first, so that the
      // composed version's score matrices find the memory free.
      if (gpu) dualcast::empty_cache(dev);
      const std::int64_t B = std::max<std::int64_t>(1, tokens / S);
      AttentionOptions opt;
      opt.causal = causal != 0;
      const Shape shape{B, H, S, D};
      const Tensor q = Tensor::randn(shape, dev, 1, dt), k = Tensor::randn(shape, dev, 2, dt);
      const Tensor v = Tensor::randn(shape, dev, 3, dt), g = Tensor::randn(shape, dev, 4, dt);
      const double flops_fwd = 4.0 * B * H * static_cast<double>(S) * S * D * (causal ? 0.5 : 1.0);
      const std::string tag = "S=" + std::to_string(S) + (causal ? " causal" : "") + " B=" + std::to_string(B);

      // Validation: fused vs composed on a batch that leaves room for the composed score matrices.
      double val_err = 0.0;
      if (gpu) {
        const std::int64_t Bv = std::min<std::int64_t>(B, 2);
        const Tensor qv = dualcast::slice(q, 0, 0, Bv), kv = dualcast::slice(k, 0, 0, Bv);
        const Tensor vv = dualcast::slice(v, 0, 0, Bv), gv = dualcast::slice(g, 0, 0, Bv);
        AttentionOptions of = opt, oc = opt;
        of.impl = AttentionImpl::fused;
        oc.impl = AttentionImpl::composed;
        const Grads f = run_once(qv, kv, vv, gv, of), c = run_once(qv, kv, vv, gv, oc);
        using dualcast::array_error;
        constexpr auto largest = dualcast::ErrorScale::largest;
        val_err = std::max({array_error(f.out, c.out, largest), array_error(f.dq, c.dq, largest),
                            array_error(f.dk, c.dk, largest), array_error(f.dv, c.dv, largest)});
        std::cerr << "[validate] " << tag << ": fused vs composed max rel err " << fmt("%.2e", val_err) << "\n";
        if (!(val_err <= validation_tol(dt))) {
          std::cerr << "attention_bench: validation failed at " << tag << "\n";
          return 4;
        }
        if (o.peers && S == 256 && Bv == 2) {
          const std::string p = std::string("c") + (causal ? "1" : "0") + "_";
          dump(valdir, {{p + "q", qv}, {p + "k", kv}, {p + "v", vv}, {p + "dout", gv}, {p + "out", f.out},
                        {p + "dq", f.dq}, {p + "dk", f.dk}, {p + "dv", f.dv}},
               manifest);
        }
      }

      struct Variant {
        std::string name;
        AttentionImpl impl;
        const char* fwd_tm;  // DUALCAST_ATTENTION_FWD_TM while it runs (attention_fused.cu); null: unset
      };
      std::vector<Variant> variants;
      if (gpu && dt != dualcast::DType::float32) variants.push_back({"dualcast_fused", AttentionImpl::fused, nullptr});
      else if (gpu)
        for (long long tm : o.fwd_tm)
          variants.push_back(tm == 0   ? Variant{"dualcast_fused", AttentionImpl::fused, nullptr}
                             : tm == 4 ? Variant{"dualcast_fused_tm4", AttentionImpl::fused, "4"}
                                       : Variant{"dualcast_fused_tm8", AttentionImpl::fused, "8"});
      variants.push_back({"dualcast_composed", AttentionImpl::composed, nullptr});
      for (const Variant& var : variants) {
        const AttentionImpl impl = var.impl;
        if (var.fwd_tm) setenv("DUALCAST_ATTENTION_FWD_TM", var.fwd_tm, 1);
        else unsetenv("DUALCAST_ATTENTION_FWD_TM");
        AttentionOptions oi = opt;
        oi.impl = impl;
        if (gpu && impl == AttentionImpl::composed) {
          // The composed backward holds about four B x H x S x S float32 matrices at once (16-bit
          // inputs run it on float32 copies).
          const double need = 4.0 * B * H * static_cast<double>(S) * S * 4.0 + (1 << 30);
#if defined(__CUDACC__)
          if (need > static_cast<double>(dcexp::cuda_mem_info().first)) {
            json r = json::object();
            r["seq"] = S;
            r["causal"] = causal;
            r["batch"] = B;
            r["method"] = "dualcast_composed";
            r["skipped"] = "does not fit in device memory";
            records.push_back(r);
            continue;
          }
#endif
        }
        Var vq = Var::param(q), vk = Var::param(k), vv = Var::param(v);
        for (const char* phase : {"fwd", "fwd+bwd"}) {
          const bool bwd = std::string(phase) == "fwd+bwd";
          auto prepare = [&](int) {
            vq.zero_grad();
            vk.zero_grad();
            vv.zero_grad();
          };
          auto step = [&](int) {
            if (bwd) {
              const Var out = dualcast::scaled_dot_product_attention(vq, vk, vv, oi);
              out.backward(g);
            } else {
              dualcast::NoGradGuard no_grad;
              (void)dualcast::scaled_dot_product_attention(vq, vk, vv, oi);
            }
          };
          const dcexp::StepTimes t = dcexp::time_steps(dev, prepare, step, warmup, reps);
          const dcexp::Summary& s = t.primary();
          const double flops = bwd ? 3.5 * flops_fwd : flops_fwd;
          json r = json::object();
          r["seq"] = S;
          r["causal"] = causal;
          r["batch"] = B;
          r["method"] = var.name;
          r["phase"] = phase;
          r["precision"] = prec;
          r["median_ms"] = s.median;
          r["p10_ms"] = s.p10;
          r["p90_ms"] = s.p90;
          r["pipelined_ms"] = t.pipelined_ms;
          r["tflops"] = flops / (s.median * 1e-3) / 1e12;
          r["validated"] = gpu ? json(true) : json();
          r["max_rel_err"] = val_err;
          records.push_back(r);
          std::cerr << "  " << tag << " " << var.name << " " << phase << ": " << fmt("%.3f", s.median)
                    << " ms, " << fmt("%.1f", r.at("tflops").get<double>()) << " TFLOP/s\n";
        }
      }
    }

  if (o.peers) {
    manifest["scalars"] = json::object();
    dcexp::write_json_file(valdir + "/manifest.json", manifest);
    std::string seq_list, causal_list;
    for (long long s : seqs) seq_list += (seq_list.empty() ? "" : ",") + std::to_string(s);
    for (long long c : o.causal) causal_list += (causal_list.empty() ? "" : ",") + std::to_string(c);
    const std::string args = "attention --valdir " + transformer::driver::shell_quote(valdir) + " --seqs " + seq_list +
                             " --heads " + std::to_string(H) + " --head-dim " + std::to_string(D) + " --tokens " +
                             std::to_string(tokens) + " --causal " + causal_list + " --reps " + std::to_string(reps) +
                             " --warmup " + std::to_string(warmup) + " --precision " + prec + (gpu ? "" : " --allow-cpu");
    const json peer = transformer::driver::run_peer(o.python, args, o.out + "/peer_attention.json");
    root["peers_raw"] = peer;
    if (const json& recs = dcexp::member(peer, "records"); recs.is_array())
      for (const auto& r : recs) records.push_back(r);
  }
  root["records"] = records;
  dcexp::write_json_file(o.out + "/results.json", root);

  // ---- CSV and table ------------------------------------------------------------------------------
  std::ofstream csv(o.out + "/results.csv");
  csv << "seq,causal,batch,method,phase,median_ms,p10_ms,p90_ms,tflops,validated\n";
  // The peer's records as well as ours: a missing or mistyped member reads as NaN / "" / false.
  const auto num = [](const json& r, const char* key) { return dcexp::number_or(dcexp::member(r, key)); };
  const auto str = [](const json& r, const char* key) { return dcexp::string_or(dcexp::member(r, key)); };
  auto find = [&](long long S, long long c, const std::string& m, const std::string& ph) -> const json* {
    for (const auto& r : records)
      if (num(r, "seq") == S && num(r, "causal") == c && str(r, "method") == m && str(r, "phase") == ph &&
          dcexp::member(r, "median_ms").is_number())
        return &r;
    return nullptr;
  };
  for (const auto& r : records)
    if (dcexp::member(r, "median_ms").is_number())
      csv << num(r, "seq") << "," << num(r, "causal") << "," << num(r, "batch") << "," << str(r, "method") << ","
          << str(r, "phase") << "," << num(r, "median_ms") << "," << num(r, "p10_ms") << "," << num(r, "p90_ms")
          << "," << num(r, "tflops") << "," << (dcexp::bool_or(dcexp::member(r, "validated")) ? 1 : 0) << "\n";
  std::cout << "\nattention forward+backward, " << dualcast::dtype_name(dt) << ", " << H << " heads, head_dim " << D << ", " << tokens
            << " tokens per batch, " << meta.at("device").get<std::string>() << " (median ms; TFLOP/s of fused)\n";
  std::cout << "  seq causal  batch      fused   composed      torch  fused-TF/s  composed/fused  torch/fused\n";
  for (long long S : seqs)
    for (long long c : o.causal) {
      const auto* f = find(S, c, "dualcast_fused", "fwd+bwd");
      const auto* cm = find(S, c, "dualcast_composed", "fwd+bwd");
      const auto* t = find(S, c, "torch_sdpa", "fwd+bwd");
      auto ms = [&](const json* r) { return r ? num(*r, "median_ms") : NAN; };
      std::cout << fmt("%5.0f", static_cast<double>(S)) << fmt("%7.0f", static_cast<double>(c))
                << fmt("%7.0f", static_cast<double>(std::max<long long>(1, tokens / S))) << fmt("%11.3f", ms(f))
                << fmt("%11.3f", ms(cm)) << fmt("%11.3f", ms(t)) << fmt("%12.1f", f ? num(*f, "tflops") : NAN)
                << fmt("%16.2f", ms(cm) / ms(f)) << fmt("%13.2f", ms(t) / ms(f)) << "\n";
    }
  std::cout << "wrote " << o.out << "/results.json, " << o.out << "/results.csv\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dcexp::cli::report_errors("attention_bench", [&] { return run(parse(argc, argv)); });
}
