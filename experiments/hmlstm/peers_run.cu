// peers_run.cu: hmlstm_experiment's side of the peers (driver.hpp): the validation folder the peers
// check themselves against (a, b arrays at dims 256, e at H=64 B=8 T=24), and peers.py run once per
// method (appending to one file) on the run's shapes, its records read back into the table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/python.hpp"
#include "driver.hpp"

#if DCEXP_HAVE_NETWORK
#include "network.hpp"
#endif

namespace hmdriver {

using dcexp::shell_quote;
using dcexp::cli::split_csv;

std::string write_validation_dir(const Options& o, dualcast::Device device) {
  std::string valdir = o.validate_dir;
  if (valdir.empty() && o.peers) valdir = o.out + "/validate";
  if (!valdir.empty()) {
    if (!make_dirs(valdir)) throw ExperimentError("cannot create --validate-dir '" + valdir + "'", 1);
    log_line("[validate] writing " + valdir + " (a, b at dims 256; e at H=64 B=8 T=24)");
    const auto arrays = hmexp::write_cell_validation(valdir, 256, device);
    json manifest = json::object();
    const std::string mpath = valdir + "/manifest.json";
    if (std::ifstream(mpath).good()) {
      try {
        manifest = dcexp::read_json_file(mpath);
      } catch (const std::exception& e) {
        log_line(std::string("  existing manifest unreadable, replaced: ") + e.what());
        manifest = json::object();
      }
    }
    json& arr = manifest["arrays"];
    if (!arr.is_object()) arr = json::object();
    for (const auto& a : arrays) {
      json e = json::object();
      e["file"] = a.name + ".bin";
      json shp = json::array();
      for (auto d : a.shape) shp.push_back(d);
      e["shape"] = shp;
      e["dtype"] = a.dtype;
      arr[a.name] = e;
    }
    if (!manifest["scalars"].is_object()) manifest["scalars"] = json::object();
    dcexp::write_json_file(mpath, manifest);
#if DCEXP_HAVE_NETWORK
    hmlstm::NetworkConfig vc;
    vc.hidden = 64;
    vc.batch = 8;
    vc.seq = 24;
    vc.device = device;
    hmlstm::write_validation(valdir, vc);
#endif
  }
  return valdir;
}

Peers run_peers(const Options& o, dualcast::Device device, bool gpu, const std::string& valdir,
                const std::string& e_variant, Results& res, const Elapsed& elapsed) {
  Peers p;
  if (o.peers) {
    dualcast::empty_cache(device);  // leave the GPU memory to the peers' frameworks
    std::vector<std::string> pw;
    // At bf16/fp16 dualcast's model (e) runs under Autocast, as torch's peer does (JAX's has no
    // float16 mode and says so).
    for (const char* w : {"a", "b", "e"})
      if (has(o, w)) pw.push_back(w);
    const std::string py = dcexp::find_python(o.python, "numpy");
    if (pw.empty()) {
      p.note = "peers skipped: none of the peer workloads (a, b, e) was selected";
    } else if (py.empty()) {
      p.note = "peers skipped: no python3 with numpy found (tried " +
                   (o.python.empty() ? std::string() : o.python + ", ") + "python3, /usr/bin/python3)";
    } else {
      std::string dims;
      for (auto d : o.dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      std::string wl;
      for (auto& w : pw) wl += (wl.empty() ? "" : ",") + w;
      const std::string pout = o.out + "/peers.json";
      std::remove(pout.c_str());
      // One process per method (appending to one file): each framework starts with the whole GPU,
      // and a crash in one cannot take the others' records with it.
      const double peers_start = dcexp::now_ms();
      for (const auto& method : split_csv(o.peer_methods)) {
        std::string cmd = shell_quote(py) + " " +
                          shell_quote(std::string(DCEXP_SOURCE_DIR) + "/experiments/peers/peers.py") +
                          " --append --workloads " + wl + " --dims " + dims + " --methods " + method +
                          " --reps " + std::to_string(std::min(o.reps, 100)) + " --out " + shell_quote(pout) +
                          " --e-reps " + std::to_string(o.e_reps) + " --e-warmup " + std::to_string(std::min(o.warmup, 5)) +
                          " --e-hidden " + std::to_string(o.e_hidden) + " --e-batch " + std::to_string(o.e_batch) +
                          " --e-seq " + std::to_string(std::max(1, o.e_seq)) + " --e-vocab 64" +
                          " --precision " + o.precision;
        if (o.peer_budget_s > 0) {
          const double left = o.peer_budget_s - (dcexp::now_ms() - peers_start) / 1000;
          cmd += fmt(" --time-budget %.3f", std::max(left, 0.001));
        }
        if (!valdir.empty()) cmd += " --validate " + shell_quote(valdir);
        if (!gpu) cmd += " --allow-cpu";
        cmd += " 1>&2";
        log_line("[peers] " + cmd + " (" + elapsed() + ")");
        const int rc = std::system(cmd.c_str());
        if (rc != 0) log_line("[peers] peers.py (" + method + ") exited with status " + std::to_string(rc));
      }
      try {
        p.raw = dcexp::read_json_file(pout);
      } catch (const std::exception& e) {
        p.note = std::string("peers: could not read ") + pout + ": " + e.what();
      }
      std::set<std::string> skipped;
      using dcexp::bool_or, dcexp::member, dcexp::number_or, dcexp::string_or;
      for (const auto& rec : p.raw.is_array() ? p.raw : json::array()) {
        const std::string w = string_or(member(rec, "workload")), method = string_or(member(rec, "method"));
        const double med = number_or(member(rec, "median_ms"));
        const std::string note = string_or(member(rec, "note"));
        if (!std::isfinite(med)) {
          if (skipped.insert(method).second) log_line("[peers] " + method + ": " + note.substr(0, 200));
          continue;
        }
        if (member(rec, "validated").is_boolean() && !bool_or(member(rec, "validated")))
          log_line("[peers] WARNING: " + method + " " + w + " failed validation: " + note.substr(0, 300));
        if (std::find(p.cols.begin(), p.cols.end(), method) == p.cols.end()) p.cols.push_back(method);
        if (w == "e") {
          res.row_for("e", e_variant, o.e_hidden).ms[method] = med;
        } else {
          const auto d = static_cast<std::int64_t>(number_or(member(rec, "dims"), 0));
          res.row_for(w, "", d).ms[method] = med;
        }
        Measurement m;
        m.workload = w;
        m.variant = w == "e" ? e_variant : "";
        m.dims = w == "e" ? o.e_hidden : static_cast<std::int64_t>(number_or(member(rec, "dims"), 0));
        m.method = method;
        m.times.gpu_ms.median = med;
        m.times.gpu_ms.p10 = number_or(member(rec, "p10_ms"));
        m.times.gpu_ms.p90 = number_or(member(rec, "p90_ms"));
        m.times.gpu_ms.n = static_cast<int>(number_or(member(rec, "reps"), 0));
        m.times.pipelined_ms = number_or(member(rec, "pipelined_ms"));
        m.times.reps = m.times.gpu_ms.n;
        m.validated = bool_or(member(rec, "validated"));
        m.max_rel_err = number_or(member(rec, "max_rel_err"));
        m.note = "peer (" + string_or(member(rec, "timer")) + "): " + note;
        res.ms.push_back(std::move(m));
      }
      if (p.note.empty())
        p.note = "peers: " + std::to_string(p.raw.size()) + " records from " + pout + (p.cols.empty() ? " (none timed)" : "");
    }
    log_line("[peers] " + p.note);
  }
  return p;
}

}  // namespace hmdriver
