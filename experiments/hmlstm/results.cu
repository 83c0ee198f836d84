// results.cu: hmlstm_experiment's outputs (driver.hpp): the table (one row per workload/size, the
// methods' times, the ratios to the floor, to mixed mode and to the best peer), results.json,
// results.csv and the summary printed at the end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/report.hpp"
#include "dualcast/precision.hpp"
#include "driver.hpp"

namespace hmdriver {
namespace {

json measurement_json(const Measurement& m) {
  json v = json::object();
  v["workload"] = m.workload;
  v["variant"] = m.variant;
  v["dims"] = m.dims;
  v["method"] = m.method;
  v["policy"] = m.policy;
  v["median_ms"] = m.median_ms();
  v["p10_ms"] = m.times.primary().p10;
  v["p90_ms"] = m.times.primary().p90;
  v["timer"] = m.times.gpu_ms.n > 0 ? "cuda_events" : "wall";
  v["gpu_ms"] = dcexp::summary_json(m.times.gpu_ms);
  v["wall_ms"] = dcexp::summary_json(m.times.wall_ms);
  v["pipelined_ms"] = m.times.pipelined_ms;
  v["reps"] = m.times.reps;
  v["warmup"] = m.times.warmup;
  v["bytes"] = static_cast<std::int64_t>(m.bytes);  // whole counts: written as integers
  v["floor_bytes"] = static_cast<std::int64_t>(m.floor_bytes);
  v["floor_ms"] = m.floor_ms;
  v["achieved_gbps"] = m.bytes > 0 ? dcexp::achieved_gbps(m.bytes, m.median_ms()) : NAN;
  v["ratio_to_floor"] = m.floor_ms > 0 ? m.median_ms() / m.floor_ms : NAN;
  v["input_sets"] = m.input_sets;
  v["tape_nodes_per_step"] = m.kernels_per_step;
  v["validated"] = m.validated;
  v["max_rel_err"] = m.max_rel_err;
  v["mallocs_during_timing"] = m.mallocs_during_timing;
  v["note"] = m.note;
  return v;
}

std::string row_label(const Row& r) {
  if (r.workload == "c") return "c " + r.variant + " @" + std::to_string(r.dims);
  if (r.workload == "e") return "e " + r.variant;
  return r.workload + (r.variant.empty() ? "" : " " + r.variant) + " " + std::to_string(r.dims);
}

struct TableOut {
  std::string text;
  json records = json::array();  // one object per row
};

TableOut make_table(const std::vector<Row>& rows, const std::vector<std::string>& peer_methods) {
  std::vector<std::string> cols{"mixed", "mixed_store", "reverse", "mixed_graph", "reverse_graph"};
  for (const auto& p : peer_methods) cols.push_back(p);
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-24s %4s %10s", "workload/size", "unit", "floor");
  os << buf;
  for (const auto& c : cols) {
    std::snprintf(buf, sizeof buf, " %11s", c.c_str());
    os << buf;
  }
  os << "  mixed/floor reverse/mixed best-peer/mixed rev_g/mix_g best-peer/mix_g\n";
  TableOut t;
  for (const auto& r : rows) {
    const bool ms_unit = r.workload == "e";
    const double scale = ms_unit ? 1.0 : 1000.0;
    std::snprintf(buf, sizeof buf, "%-24s %4s %10s", row_label(r).c_str(), ms_unit ? "ms" : "us",
                  std::isfinite(r.floor_ms) ? fmt(ms_unit ? "%.3f" : "%.1f", r.floor_ms * scale).c_str() : "n/a");
    os << buf;
    json jr = json::object();
    jr["row"] = row_label(r);
    jr["workload"] = r.workload;
    jr["variant"] = r.variant;
    jr["dims"] = r.dims;
    jr["floor_ms"] = r.floor_ms;
    for (const auto& c : cols) {
      const auto it = r.ms.find(c);
      const bool ok = it != r.ms.end() && std::isfinite(it->second);
      std::snprintf(buf, sizeof buf, " %11s", ok ? fmt(ms_unit ? "%.3f" : "%.1f", it->second * scale).c_str() : "-");
      os << buf;
      jr[c + "_ms"] = ok ? it->second : NAN;
    }
    auto get = [&](const std::string& k) {
      const auto it = r.ms.find(k);
      return it == r.ms.end() ? NAN : it->second;
    };
    const double mixed = get("mixed"), reverse = get("reverse");
    double best_peer = NAN;
    for (const auto& p : peer_methods) {
      const double v = get(p);
      if (std::isfinite(v) && !(v >= best_peer)) best_peer = v;
    }
    const double mixed_g = get("mixed_graph"), reverse_g = get("reverse_graph");
    const double r1 = mixed / r.floor_ms, r2 = reverse / mixed, r3 = best_peer / mixed;
    const double r4 = reverse_g / mixed_g, r5 = best_peer / mixed_g;
    auto ratio = [](double x) { return std::isfinite(x) ? fmt("%.2f", x) : std::string("-"); };
    std::snprintf(buf, sizeof buf, "  %11s %13s %15s %11s %15s\n", ratio(r1).c_str(), ratio(r2).c_str(),
                  ratio(r3).c_str(), ratio(r4).c_str(), ratio(r5).c_str());
    os << buf;
    jr["mixed_over_floor"] = r1;
    jr["reverse_over_mixed"] = r2;
    jr["best_peer_over_mixed"] = r3;
    jr["reverse_graph_over_mixed_graph"] = r4;
    jr["best_peer_over_mixed_graph"] = r5;
    t.records.push_back(std::move(jr));
  }
  t.text = os.str();
  return t;
}

}  // namespace

int write_outputs(const Options& o, const Machine& mc, const Results& res, const WorkloadE& e, const Peers& peers,
                  const Elapsed& elapsed) {
  const dualcast::Device device = mc.device;
  const std::string& dev_name = mc.name;
  const dcexp::Bandwidth& bw = mc.bw;
  const std::size_t cache = mc.cache;
  const bool gpu = device.is_cuda();
  const TableOut table = make_table(res.rows, peers.cols);
  json root = json::object();
  json meta = json::object();
  meta["tool"] = "hmlstm_experiment";
  meta["date"] = dcexp::iso_time();
  meta["device"] = device.str();
  meta["device_name"] = dev_name;
  meta["copy_bandwidth_gbps"] = bw.gbps;
  meta["copy_bandwidth_p10_gbps"] = bw.gbps_p10;
  meta["copy_bandwidth_p90_gbps"] = bw.gbps_p90;
  meta["copy_bandwidth_how"] = bw.how;
  meta["cache_bytes"] = cache;
  meta["reps"] = o.reps;
  meta["warmup"] = o.warmup;
  meta["dtype"] = dualcast::dtype_name(cell_dtype(o));  // of a, b, d (c is float32 always)
  meta["precision"] = o.precision;
  meta["matmul_precision"] = dualcast::get_float32_matmul_precision();
  if (!e.matmul_precision.empty()) meta["e_matmul_precision"] = e.matmul_precision;  // e's own (bf16: "medium")
  meta["floor"] = std::string("bytes / copy bandwidth; recompute counts: a,d 14, b 22, c 3K+2 values per element, of ") +
                  std::to_string(dualcast::dtype_size(cell_dtype(o))) + " bytes in a, b, d and 4 in c";
  meta["timer"] = gpu ? "CUDA events per step from an idle device (median of reps); wall = host clock"
                      : "host wall clock per step (median of reps)";
  root["meta"] = meta;
  root["measurements"] = json::array();
  for (const auto& m : res.ms) root["measurements"].push_back(measurement_json(m));
  root["table"] = table.records;
  root["training"] = e.training;
  if (!e.accuracy.empty()) root["accuracy"] = e.accuracy;
  root["peers.note"] = peers.note;
  root["peers_raw"] = peers.raw;
  dcexp::write_json_file(o.out + "/results.json", root);

  {
    std::ofstream csv(o.out + "/results.csv");
    csv.precision(9);
    csv << "workload,variant,dims,method,policy,median_ms,p10_ms,p90_ms,wall_median_ms,pipelined_ms,bytes,floor_ms,"
           "achieved_gbps,ratio_to_floor,reps,input_sets,tape_nodes_per_step,validated,max_rel_err,mallocs_during_timing,note\n";
    for (const auto& m : res.ms) {
      std::string note = m.note;
      std::replace(note.begin(), note.end(), '"', '\'');
      csv << m.workload << "," << m.variant << "," << m.dims << "," << m.method << "," << m.policy << ","
          << m.median_ms() << "," << m.times.primary().p10 << "," << m.times.primary().p90 << ","
          << m.times.wall_ms.median << "," << m.times.pipelined_ms << "," << m.bytes << "," << m.floor_ms << ","
          << (m.bytes > 0 ? dcexp::achieved_gbps(m.bytes, m.median_ms()) : NAN) << ","
          << (m.floor_ms > 0 ? m.median_ms() / m.floor_ms : NAN) << "," << m.times.reps << "," << m.input_sets << ","
          << m.kernels_per_step << "," << (m.validated ? "true" : "false") << "," << m.max_rel_err << ","
          << m.mallocs_during_timing << ",\"" << note << "\"\n";
    }
  }

  std::cout << "\nHM-LSTM experiment on " << device.str() << " (" << dev_name << "), precision " << o.precision
            << " (a, b, d in " << dualcast::dtype_name(cell_dtype(o)) << "); copy bandwidth "
            << fmt("%.1f", bw.gbps) << " GB/s; time per forward+backward (a-d: " << (gpu ? "CUDA events" : "wall clock")
            << ", median of " << o.reps << "), per training step (e)\n";
  std::cout << "floor = bytes (recompute count) / copy bandwidth; mixed = Partials::recompute; "
               "mixed_store = Partials::store; reverse = select form on Vars; *_graph = the same step "
               "recorded once (dualcast::Graph) and replayed\n\n";
  std::cout << table.text;
  if (has(o, "e") && e.training.contains("mixed")) {
    const auto& tm = e.training.at("mixed");
    const auto& tr = e.training.at("reverse");
    auto first_last = [](const json& l, const char* key) {
      const auto& v = l.at(key);
      if (v.empty()) return std::string("-");
      return fmt("%.3f", v.front().get<double>()) + " -> " + fmt("%.3f", v.back().get<double>());
    };
    std::cout << "\ntraining (" << e.training.at("config").get<std::string>() << "): train bits/char mixed "
              << first_last(tm, "train_bpc") << " (valid " << first_last(tm, "valid_bpc") << "), reverse "
              << first_last(tr, "train_bpc") << " (valid " << first_last(tr, "valid_bpc") << "); "
              << fmt("%.1f", tm.at("ms_per_step").get<double>()) << " vs " << fmt("%.1f", tr.at("ms_per_step").get<double>())
              << " ms/step; " << e.training.at("message").get<std::string>() << "\n";
    if (e.training.contains("capture_message")) std::cout << e.training.at("capture_message").get<std::string>() << "\n";
    if (!e.training_ok) std::cout << "WARNING: training curves disagree or bits/char did not fall (see results.json)\n";
  }
  if (!peers.note.empty()) std::cout << peers.note << "\n";
  std::cout << "\nwrote " << o.out << "/results.json, " << o.out << "/results.csv" << (has(o, "e") && o.train_steps > 0 ? ", training.csv" : "")
            << " (" << elapsed() << ")\n";
  return 0;
}

}  // namespace hmdriver
