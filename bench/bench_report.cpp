#include "bench/bench_report.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

namespace attnkit::bench {
namespace {

using Json = nlohmann::ordered_json;

std::string fixed(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

std::string pad(const std::string& s, int width, bool right) {
  if (static_cast<int>(s.size()) >= width) return s;
  const std::string fill(static_cast<size_t>(width) - s.size(), ' ');
  return right ? fill + s : s + fill;
}

bool needs_shell_quote(const std::string& arg) {
  if (arg.empty()) return true;
  for (char ch : arg) {
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                       (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' ||
                       ch == '/' || ch == '=' || ch == ',' || ch == ':' || ch == '+';
    if (!plain) return true;
  }
  return false;
}

std::string shell_quote(const std::string& arg) {
  if (!needs_shell_quote(arg)) return arg;
  std::string out = "'";
  for (char ch : arg) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

Json case_params(const BenchCase& c) {
  Json p;
  p["batch"] = c.batch;
  if (c.kind == BenchKind::kExtend) {
    p["prefix_len"] = c.prefix_len;
    p["new_tokens"] = c.new_tokens;
    p["causal"] = c.causal;
    if (!c.prefix_lens.empty()) p["prefix_lens"] = c.prefix_lens;
    if (!c.new_lens.empty()) p["new_lens"] = c.new_lens;
    if (c.mixed) p["mixed"] = true;
  } else {
    p["kv_len"] = c.kv_len;
    if (!c.kv_lens.empty()) p["kv_lens"] = c.kv_lens;
  }
  // What the FLOPs / bytes depend on beyond the shape (the case name carried them alone): the
  // verify step's query tokens and its tree, the tokens every request shares.
  if (c.s_q != 1) p["s_q"] = c.s_q;
  if (c.topk != 1) p["topk"] = c.topk;
  if (c.shared_prefix > 0) p["shared_prefix"] = c.shared_prefix;
  p["q_heads"] = c.q_heads;
  p["kv_heads"] = c.kv_heads;
  p["head_dim"] = c.head_dim;
  p["v_head_dim"] = c.v_head_dim;
  if (c.kind == BenchKind::kMlaDecode) {
    p["kv_lora_rank"] = c.kv_lora_rank;
    p["qk_rope_head_dim"] = c.qk_rope_head_dim;
  }
  p["page_size"] = c.page_size;
  if (!c.shuffle_pages) p["shuffle_pages"] = false;
  p["dtype"] = dtype_name(c.dtype);
  p["kv_dtype"] = dtype_name(c.kv_dtype);
  if (c.fp8_q) p["fp8_q"] = true;
  if (c.sliding_window >= 0) p["sliding_window"] = c.sliding_window;
  if (c.logit_cap > 0.f) p["logit_cap"] = c.logit_cap;
  if (c.sinks) p["sinks"] = true;
  return p;
}

}  // namespace

std::string table_header(int name_width) {
  return pad("backend", 14, false) + " " + pad("case", name_width, false) + " " +
         pad("ms", 10, true) + " " + pad("GB/s", 9, true) + " " + pad("%ceil", 6, true) + " " +
         pad("TFLOP/s", 8, true) + " " + pad("copies", 6, true) + "  status";
}

std::string table_row(const CaseResult& r, int name_width) {
  std::string line = pad(r.backend, 14, false) + " " + pad(r.bench_case.name, name_width, false);
  if (r.status != CaseStatus::kOk) {
    return line + "  " + case_status_name(r.status) + ": " + r.message;
  }
  line += " " + pad(fixed(r.ms_median, 4), 10, true) + " " + pad(fixed(r.gbs, 2), 9, true) + " " +
          pad(r.ceiling_ratio > 0 ? fixed(100.0 * r.ceiling_ratio, 1) : "-", 6, true) + " " +
          pad(fixed(r.tflops, 4), 8, true) + " " + pad(std::to_string(r.copies), 6, true) + "  ok";
  if (r.verified) line += " (verified: rel_l2 " + fixed(r.rel_l2, 6) + ")";
  if (r.refresh_samples > 0) {
    line += " (replay metadata refresh, host: median " + fixed(r.refresh_us_median, 1) +
            " us, p90 " + fixed(r.refresh_us_p90, 1) + " us, one replay ahead; median " +
            fixed(r.refresh_idle_us_median, 1) + " us idle; " + std::to_string(r.refresh_samples) +
            " replays each)";
  }
  if (!r.paired_ratios.empty()) {
    line += " (paired copy: median " + fixed(100.0 * r.paired_ratio_median, 1) + "% of " +
            std::to_string(r.paired_ratios.size()) + " rounds:";
    for (double x : r.paired_ratios) line += " " + fixed(100.0 * x, 0);
    line += ")";
    if (!r.paired_read_ratios.empty()) {
      line += " (paired read: median " + fixed(100.0 * r.paired_read_ratio_median, 1) + "%, " +
              fixed(median(r.paired_read_gbs), 1) + " GB/s read ceiling)";
    }
  }
  if (!r.paired_peak_ratios.empty()) {
    line += " (paired peak: median " + fixed(100.0 * r.paired_peak_ratio_median, 1) + "% of " +
            std::to_string(r.paired_peak_ratios.size()) + " rounds:";
    for (double x : r.paired_peak_ratios) line += " " + fixed(100.0 * x, 0);
    line += "; peak readings " + fixed(median(r.paired_peak_tflops), 2) + " TFLOP/s median)";
  }
  if (!r.paired_note.empty()) line += " (paired rounds " + r.paired_note + ")";
  return line;
}

Json to_json(const BenchRun& run) {
  Json j;
  j["schema"] = kBenchJsonSchema;
  j["command"] = run.command;
  j["date"] = run.date;
  Json dev;
  dev["device"] = run.device;
  dev["name"] = run.device_info.name;
  dev["platform"] = platform_name(run.device_info.platform);
  if (run.device_info.platform == Platform::kCUDA) {
    dev["compute_capability"] = run.device_info.compute_capability;
    dev["sm_count"] = run.device_info.sm_count;
  }
  dev["cpu_threads"] = run.device_info.cpu_threads;
  dev["omp_threads"] = run.threads;
  dev["avx512"] = run.device_info.has_avx512;
  dev["avx512_bf16"] = run.device_info.has_avx512_bf16;
  dev["avx512_vbmi"] = run.device_info.has_avx512_vbmi;
  dev["amx_bf16"] = run.device_info.has_amx_bf16;
  dev["load_average_start"] = run.load_start;
  dev["load_average_end"] = run.load_end;
  j["device"] = dev;
  Json settings;
  settings["cases_file"] = run.cases_file;
  settings["description"] = run.case_file_description;
  settings["backends"] = run.backends;
  settings["filter"] = run.filter;
  settings["warmup"] = run.settings.warmup;
  settings["iters"] = run.settings.iters;
  settings["rotate_bytes"] = run.settings.rotate_bytes;
  settings["rotate_why"] = run.rotate_why;
  settings["max_copies"] = run.settings.max_copies;
  settings["verify"] = run.settings.verify;
  settings["launches"] = run.settings.launches;
  settings["graph"] = run.settings.graph;
  settings["timer"] = run.device == "cpu" ? "std::chrono::steady_clock per call, median"
                      : run.settings.graph
                          ? "CUDA events per CUDA-graph replay / forwards_per_sample, median"
                          : "CUDA events per sample of launches forwards / launches, median";
  j["settings"] = settings;
  Json ceilings = Json::array();
  for (const Ceiling& c : run.ceilings) {
    Json x = {{"name", c.name}, {"method", c.method}};
    if (c.gbs > 0) {
      x["bytes"] = c.bytes;
      x["gbs"] = c.gbs;
      x["median_gbs"] = c.median_gbs;
    }
    if (c.tflops > 0) {
      x["flops"] = c.flops;
      x["tflops"] = c.tflops;
      x["median_tflops"] = c.median_tflops;
      if (c.min_tflops > 0) x["min_tflops"] = c.min_tflops;
    }
    ceilings.push_back(x);
  }
  j["ceilings"] = ceilings;
  Json results = Json::array();
  for (const CaseResult& r : run.results) {
    Json x;
    x["backend"] = r.backend;
    x["case"] = r.bench_case.name;
    x["kind"] = bench_kind_name(r.bench_case.kind);
    x["params"] = case_params(r.bench_case);
    x["status"] = case_status_name(r.status);
    x["message"] = r.message;
    const bool memory =
        r.status == CaseStatus::kOk ? r.memory_bound : is_memory_bound(r.bench_case);
    x["bound"] = memory ? "memory" : "compute";
    x["flops"] = r.flops;
    x["bytes"] = r.bytes;
    if (r.status == CaseStatus::kOk) {
      x["copies"] = r.copies;
      x["timing"] = r.timing;
      x["forwards_per_sample"] = r.forwards_per_sample;
      x["warmup"] = r.warmup;
      x["iters"] = r.iters;
      x["ms_median"] = r.ms_median;
      x["ms_min"] = r.ms_min;
      x["ms_max"] = r.ms_max;
      x["gbs"] = r.gbs;
      x["tflops"] = r.tflops;
      x["ceiling"] = r.ceiling;
      x["ceiling_ratio"] = r.ceiling_ratio;
      if (r.refresh_samples > 0) {
        x["replay_refresh"] = {{"method",
                                "host wall time of init_forward_metadata_replay_cuda_graph, "
                                "each call followed by one replay of the captured graph; call i "
                                "issued while replay i - 1 runs, after replay i - 2 finished "
                                "(us_*); then with the stream drained before each call "
                                "(idle_us_median)"},
                               {"samples", r.refresh_samples},
                               {"us_median", r.refresh_us_median},
                               {"us_p90", r.refresh_us_p90},
                               {"us_max", r.refresh_us_max},
                               {"idle_us_median", r.refresh_idle_us_median}};
      }
      if (!r.paired_note.empty()) x["paired_note"] = r.paired_note;
      if (!r.paired_ratios.empty()) {
        x["paired_copy"] = {{"method",
                             "per round: one pass of the copy ceiling, then that many forwards; "
                             "ratio = the case's GB/s over the median of the round's calls / the "
                             "pass's GB/s"},
                            {"calls_per_round", r.paired_calls},
                            {"copy_gbs", r.paired_copy_gbs},
                            {"gbs", r.paired_gbs},
                            {"ratios", r.paired_ratios},
                            {"ratio_median", r.paired_ratio_median},
                            {"read_gbs", r.paired_read_gbs},
                            {"read_ratios", r.paired_read_ratios},
                            {"read_ratio_median", r.paired_read_ratio_median}};
      }
      if (!r.paired_peak_ratios.empty()) {
        x["paired_peak"] = {
            {"method", "per round: a reading of the compute ceiling (the ceiling's kernel, " +
                           std::to_string(bench::kPairedPeakReps) +
                           " passes, reduced as the table's ratio uses it), then that many "
                           "forwards; ratio = the case's TFLOP/s over the median of the "
                           "round's calls / the reading"},
            {"ceiling", r.ceiling},
            {"calls_per_round", r.paired_calls},
            {"peak_tflops", r.paired_peak_tflops},
            {"tflops", r.paired_tflops},
            {"ratios", r.paired_peak_ratios},
            {"ratio_median", r.paired_peak_ratio_median}};
      }
    }
    if (r.verified)
      x["verify"] = {{"rel_l2", r.rel_l2},
                     {"max_abs", r.max_abs},
                     {"passed", r.status != CaseStatus::kMismatch}};
    results.push_back(x);
  }
  j["results"] = results;
  return j;
}

std::string to_csv(const BenchRun& run) {
  std::ostringstream s;
  s << "backend,case,kind,batch,kv_len,prefix_len,new_tokens,causal,q_heads,kv_heads,head_dim,"
       "v_head_dim,page_size,dtype,kv_dtype,status,copies,ms_median,ms_min,ms_max,flops,bytes,"
       "gbs,tflops,ceiling,ceiling_ratio,rel_l2,message\n";
  for (const CaseResult& r : run.results) {
    const BenchCase& c = r.bench_case;
    const bool ok = r.status == CaseStatus::kOk;
    s << csv_field(r.backend) << ',' << c.name << ',' << bench_kind_name(c.kind) << ',' << c.batch
      << ',' << c.kv_len << ',' << c.prefix_len << ',' << c.new_tokens << ',' << (c.causal ? 1 : 0)
      << ',' << c.q_heads << ',' << c.kv_heads << ',' << c.head_dim << ',' << c.v_head_dim << ','
      << c.page_size << ',' << dtype_name(c.dtype) << ',' << dtype_name(c.kv_dtype) << ','
      << case_status_name(r.status) << ',' << (ok ? std::to_string(r.copies) : "") << ','
      << (ok ? fixed(r.ms_median, 6) : "") << ',' << (ok ? fixed(r.ms_min, 6) : "") << ','
      << (ok ? fixed(r.ms_max, 6) : "") << ',' << fixed(r.flops, 0) << ',' << fixed(r.bytes, 0)
      << ',' << (ok ? fixed(r.gbs, 3) : "") << ',' << (ok ? fixed(r.tflops, 5) : "") << ','
      << csv_field(r.ceiling) << ',' << (ok && r.ceiling_ratio > 0 ? fixed(r.ceiling_ratio, 4) : "")
      << ',' << (r.verified ? fixed(r.rel_l2, 8) : "") << ',' << csv_field(r.message) << '\n';
  }
  return s.str();
}

Status write_text_file(const std::string& path, const std::string& text) {
  // stdio rather than a stream, so that a failure keeps its errno for the message ("No space left
  // on device" for /dev/full).
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return Status::not_found("cannot open " + path + " for writing (" + std::strerror(errno) + ")");
  }
  const bool written =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !written) {
    return Status::internal("writing " + path + " failed (" + std::strerror(written ? errno : err) +
                            ")");
  }
  return Status::ok();
}

std::string current_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    if (!out.empty()) out += ' ';
    out += shell_quote(all.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string host_load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "";
  return a + " " + b + " " + c;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace attnkit::bench
