// `attnkit bench` (backends x case file: verify, time, report) and `attnkit run` (one case of the
// shared table or a JSON CaseSpec, with --verify).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "bench/bench_case_file.h"
#include "bench/bench_ceilings.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "bench/bench_spec_json.h"
#include "harness/case_runner.h"
#include "tools/attnkit/cli_checks.h"
#include "tools/attnkit/commands.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace attnkit {
namespace {

// CPU defaults are small because one CPU call of a sweep point takes milliseconds to seconds;
// CUDA calls take microseconds, so more samples cost nothing.
constexpr int kCpuWarmup = 2;
constexpr int kCpuIters = 7;
constexpr int kCudaWarmup = 10;
constexpr int kCudaIters = 50;
// The most --warmup / --iters take: a million calls of the smallest case already run for minutes,
// and the timing samples are held in memory.
constexpr int kMaxCalls = 1000000;
// --gemm-tflops: a compute ceiling between a slow CPU core's and past any GPU's (a subnormal value
// printed as 0 and divided the ratios to inf).
constexpr double kMinGemmTflops = 1e-3;
constexpr double kMaxGemmTflops = 1e5;
constexpr int kCpuCopyReps = 5;
// CPU memory-bound cases: rounds of (one copy pass, then forwards) after the timed calls.
constexpr int kCpuPairedRounds = 9;
// Each paired round also runs a copy or compute-peak pass, which --paired-max-seconds does not
// count: the bound keeps a run's rounds to minutes.
constexpr int kMaxPairedRounds = 100;
// --paired-max-seconds: at most an hour of one case's paired forwards (with --paired-calls at most
// kMaxCalls, the rounds stay bounded; 1e300 with INT_MAX calls ran for good).
constexpr double kMaxPairedSeconds = 3600;
constexpr double kMinPairedSeconds = 1e-9;  // "no paired calls" in effect, yet a positive bound
constexpr int kCudaCopyReps = 10;
constexpr int kCpuPeakReps = 5;
// Short AMX peak passes before and again after the cases (bench_ceilings.cpp: kAmxPeakIters).
constexpr int kCpuAmxPeakReps = 15;
constexpr int64_t kCudaCopyBytes = int64_t{1} << 30;  // >= 1 GiB, far beyond any L2

struct BenchArgs {
  std::string backends;
  std::string cases;
  std::string device;
  bool verify = false;
  std::string json_path;
  std::string csv_path;
  int warmup = -1;
  int iters = -1;
  int launches = 1;
  bool graph = false;
  int paired_rounds = -1;
  int paired_calls = 5;
  double paired_max_seconds = bench::kPairedMaxSeconds;
  std::string filter;
  int64_t rotate_mib = 0;
  int max_copies = 512;
  double gemm_tflops = 0;
  bool list = false;
};

struct RunArgs {
  std::string backend;
  std::string case_arg;
  std::string device;
  bool verify = false;
  bool save_kv = false;
  int layers = 2;
  bool list_cases = false;
};

// The comma-separated items of s, empty ones included ("a,,b" -> a, "", b).
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "cpu", "cuda" or "cuda:N"; empty = a CUDA device when this build and machine have one.
Device resolve_device(const std::string& name, DeviceInfo* info) {
  if (name.empty()) {  // cuda if present, else the CPU
    Result<DeviceInfo> cuda = detect_cuda(0);
    *info = cuda ? *cuda : detect_cpu();
    return cuda ? Device::cuda(0) : Device::cpu();
  }
  Result<Device> device = Device::parse(name);
  if (!device) cli_fail("--device " + name + " is not a device (accepted: cpu, cuda, cuda:N)");
  if (device->is_cpu()) {
    *info = detect_cpu();
  } else {
    Result<DeviceInfo> cuda = detect_cuda(device->ordinal);
    if (!cuda) cli_fail("--device " + name + ": " + cuda.status().to_string());
    *info = *cuda;
  }
  return *device;
}

// The CPU copy ceiling's buffer: max(2 x LLC, kMinCpuRotateBytes), whatever --rotate-mib says, so
// that the ceiling always streams from memory.
int64_t cpu_copy_bytes() {
  return std::max(2 * bench::host_llc_bytes(nullptr), bench::kMinCpuRotateBytes);
}

// `path` with the symlinks of its existing part resolved (a new file in a linked directory and
// the same name through the directory itself compare equal); lexically normal where that fails.
std::filesystem::path resolved_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) p = std::filesystem::absolute(path, ec).lexically_normal();
  return p;
}

// Whether two paths name one file: equal once resolved, or the same existing file.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return resolved_path(a) == resolved_path(b) || std::filesystem::equivalent(a, b, ec);
}

// Where `path` stands for writing, without changing anything the user did not ask for: 0 when an
// existing file (or a symlink's existing target) opens for append, or when a new file can be
// created there (the probe creates it and removes the file it made); else the errno. A dangling
// symlink is followed to its target, which is probed the same way; the link itself is never
// removed.
int probe_writable(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  constexpr int kMaxLinks = 40;  // as the kernel's ELOOP limit
  for (int hop = 0; hop < kMaxLinks; ++hop) {
    // O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of blocking the probe.
    int fd = ::open(p.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      return 0;
    }
    if (errno != ENOENT) return errno;
    fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {  // made by the probe: removed again
      ::close(fd);
      ::unlink(p.c_str());
      return 0;
    }
    if (errno != EEXIST) return errno;
    // ENOENT, then EEXIST: `p` is a dangling symlink (O_EXCL does not follow it).
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::read_symlink(p, ec);
    if (ec) return ec.value();
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return ELOOP;
}

// An output file named by `flag`: given with a name (an empty value is refused, no value means no
// file), not a directory, not the --cases input, in an existing directory and writable now
// (probe_writable: nothing is truncated, and no file or link of the user's is created or removed),
// so that a bad path fails before the sweep instead of after it.
void check_output_path(const CLI::App& cmd, const char* flag, const std::string& path,
                       const std::string& cases) {
  if (path.empty()) {
    if (cmd.count(flag) > 0) cli_fail(std::string(flag) + " is empty (expected a file name)");
    return;
  }
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    cli_fail(std::string(flag) + " " + path + " is a directory (expected a file name)");
  }
  if (same_file(path, cases)) {
    cli_fail(std::string(flag) + " " + path + " is the --cases file (it would be overwritten)");
  }
  const std::filesystem::path dir = p.parent_path().empty() ? "." : p.parent_path();
  if (!std::filesystem::is_directory(dir, ec)) {
    cli_fail(std::string(flag) + " " + path + ": directory " + dir.string() +
             " does not exist (the file is written after the run)");
  }
  if (const int err = probe_writable(p); err != 0) {
    cli_fail(std::string(flag) + " " + path + " cannot be opened for writing (" +
             std::strerror(err) + ")");
  }
}

int omp_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// The options that only act on a run (timing, verification, outputs): refused beside a true
// --list, which runs nothing.
constexpr const char* kRunOnlyOptions[] = {
    "--verify",     "--json",       "--csv",           "--warmup",       "--iters",
    "--launches",   "--graph",      "--paired-rounds", "--paired-calls", "--paired-max-seconds",
    "--rotate-mib", "--max-copies", "--gemm-tflops"};

// Refuses each of `options` given beside the true listing flag `flag` (which runs nothing; `what`
// says what it does instead).
template <class Options>
void refuse_beside(const CLI::App& cmd, const Options& options, const std::string& flag,
                   const std::string& what) {
  for (const char* option : options) {
    if (cmd.count(option) > 0)
      cli_fail(std::string(option) + " excludes " + flag + " (" + what + ")");
  }
}

// The backends named by --backend, each once in first-named order: `all` adds every built backend
// that runs on `platform` and was not named before. Refused when none of them can run here, with
// each one's reason, before any case is prepared (bench_main also fails a run whose every case
// was skipped).
std::vector<const BackendDescriptor*> select_backends(const std::string& flag_value,
                                                      const BackendRegistry& registry,
                                                      Platform platform) {
  std::vector<const BackendDescriptor*> backends;
  std::vector<std::string> why_not;
  const auto add = [&](const BackendDescriptor* d) {
    if (std::find(backends.begin(), backends.end(), d) == backends.end()) backends.push_back(d);
  };
  for (const std::string& name : split_commas(flag_value)) {
    if (name.empty()) {
      cli_fail("--backend \"" + flag_value +
               "\" has an empty name (expected a comma-separated list of backend names, or all)");
    }
    if (name == "all") {
      for (const BackendDescriptor& d : registry.all()) {
        if (d.built && d.runs_on(platform)) add(&d);
      }
      continue;
    }
    Result<const BackendDescriptor*> d = registry.get(name);
    if (!d) cli_fail("--backend: " + d.status().to_string());
    add(*d);
  }
  bool any_runnable = false;
  for (const BackendDescriptor* d : backends) {
    if (!d->built) {
      why_not.push_back(d->name + " is not built in this binary (" + d->not_built_reason + ")");
    } else if (!d->runs_on(platform)) {
      std::string on;
      for (Platform p : d->platforms) {
        on += (on.empty() ? "" : ", ") + std::string(platform_name(p));
      }
      why_not.push_back(d->name + " runs on " + on + ", not " + platform_name(platform));
    } else {
      any_runnable = true;
    }
  }
  if (backends.empty() && flag_value.find("all") != std::string::npos) {
    cli_fail("--backend " + flag_value + ": no built backend runs on " +
             std::string(platform_name(platform)));
  }
  if (backends.empty()) {
    std::string names;
    for (const BackendDescriptor& d : registry.all()) names += (names.empty() ? "" : ", ") + d.name;
    cli_fail("--backend \"" + flag_value +
             "\" names no backend (accepted: a comma-separated list of " + names + ", or all)");
  }
  if (!any_runnable) {
    std::string reasons;
    for (const std::string& w : why_not) reasons += (reasons.empty() ? "" : "; ") + w;
    cli_fail("--backend " + flag_value + ": no named backend can run on this device: " + reasons);
  }
  return backends;
}

void bench_main(const CLI::App& cmd, const BenchArgs& args) {
  if (args.list) {  // only a true --list: --list=false runs as usual
    refuse_beside(cmd, kRunOnlyOptions, "--list", "--list prints the case names and runs nothing");
  }
  // Options that need one kind of device, checked against a device named by --device before it
  // is looked for (so that --device cuda on a machine without one still names the option), and
  // against the device found.
  const auto check_device_options = [&](const Device& device) {
    if (args.graph && !device.is_cuda()) {
      cli_fail("--graph times CUDA-graph replays: it needs --device cuda (got --device " +
               device.to_string() + ")");
    }
    // The CPU loop times one forward per sample: N back-to-back forwards would be claimed only.
    if (args.launches > 1 && !device.is_cuda()) {
      cli_fail("--launches " + std::to_string(args.launches) +
               " enqueues back-to-back CUDA forwards: it needs --device cuda (got --device " +
               device.to_string() + "; the CPU times one forward per sample)");
    }
    // The paired rounds pair forwards with passes of the CPU ceilings (copy, compute peak); CUDA
    // has none.
    for (const char* option : {"--paired-rounds", "--paired-calls", "--paired-max-seconds"}) {
      if (device.is_cuda() && cmd.count(option) > 0) {
        cli_fail(std::string(option) +
                 " applies to --device cpu only (paired rounds against passes of the CPU copy and "
                 "compute peak; got --device " +
                 device.to_string() + ")");
      }
    }
  };
  if (Result<Device> named = Device::parse(args.device); !args.device.empty() && named) {
    check_device_options(*named);
  }
  if (cmd.count("--paired-rounds") > 0 && args.paired_rounds == 0) {
    for (const char* option : {"--paired-calls", "--paired-max-seconds"}) {
      if (cmd.count(option) > 0) {
        cli_fail(std::string(option) + " has nothing to act on: --paired-rounds 0 turns the " +
                 "paired rounds off");
      }
    }
  }
  const BackendRegistry& registry = builtin_registry();
  bench::BenchRun run;
  run.command = bench::current_command_line();
  run.date = bench::utc_now_iso8601();
  run.load_start = bench::host_load_average();
  const Device device = resolve_device(args.device, &run.device_info);
  run.device = device.to_string();
  check_device_options(device);
  run.threads = omp_threads();

  Result<bench::CaseFile> file = bench::load_case_file(args.cases);
  if (!file) cli_fail("--cases: " + file.status().to_string());
  const std::vector<bench::BenchCase> cases = bench::filter_cases(file->cases, args.filter);
  if (cases.empty()) {
    cli_fail("--filter \"" + args.filter + "\" matches none of the " +
             std::to_string(file->cases.size()) + " cases of " + args.cases);
  }
  run.cases_file = args.cases;
  run.case_file_description = file->description;
  run.filter = args.filter;
  int name_width = 4;
  for (const bench::BenchCase& c : cases) {
    name_width = std::max(name_width, static_cast<int>(c.name.size()));
  }
  // Every point and both output files are checked before any ceiling or case is timed, so that a
  // bad point (shared_prefix past kv_len, ...) or an unwritable --json fails in a second instead
  // of after the sweep.
  for (const bench::BenchCase& c : cases) {
    if (const Status s = harness::validate_case(bench::to_case_spec(c)); !s.is_ok()) {
      cli_fail("--cases " + args.cases + ": " + s.message());
    }
  }
  check_output_path(cmd, "--json", args.json_path, args.cases);
  check_output_path(cmd, "--csv", args.csv_path, args.cases);
  if (!args.json_path.empty() && !args.csv_path.empty() &&
      same_file(args.json_path, args.csv_path)) {
    cli_fail("--json and --csv name the same file " + args.csv_path +
             " (the CSV would overwrite the JSON)");
  }

  const std::vector<const BackendDescriptor*> backends =
      select_backends(args.backends, registry, run.device_info.platform);
  for (const BackendDescriptor* d : backends) run.backends.push_back(d->name);
  if (args.list) {  // after --backend is checked: a bad name is reported, not ignored
    for (const bench::BenchCase& c : cases) std::cout << c.name << "\n";
    return;
  }

  bench::RunSettings& settings = run.settings;
  settings.device = device;
  settings.verify = args.verify;
  settings.warmup = args.warmup >= 0 ? args.warmup : (device.is_cuda() ? kCudaWarmup : kCpuWarmup);
  settings.iters = args.iters > 0 ? args.iters : (device.is_cuda() ? kCudaIters : kCpuIters);
  settings.max_copies = args.max_copies;
  settings.launches = args.launches;
  settings.graph = args.graph;
  settings.paired_rounds =
      device.is_cpu() ? (args.paired_rounds >= 0 ? args.paired_rounds : kCpuPairedRounds) : 0;
  settings.paired_calls = args.paired_calls;
  settings.paired_max_seconds = args.paired_max_seconds;
  if (args.rotate_mib > 0) {
    // The rotating copies are allocated and filled on this host for a CPU device: more than it has
    // available would get the process killed part-way (CUDA allocations fail with an error).
    const int64_t available = harness::host_memory_available();
    if (device.is_cpu() && available > 0 && (args.rotate_mib << 20) > available) {
      cli_fail("--rotate-mib " + std::to_string(args.rotate_mib) + " is above the " +
               std::to_string(available >> 20) + " MiB this host has available");
    }
    settings.rotate_bytes = args.rotate_mib << 20;
    run.rotate_why = "--rotate-mib " + std::to_string(args.rotate_mib);
  } else {
    Result<int64_t> rotate = bench::default_rotate_bytes(device, &run.rotate_why);
    if (!rotate) cli_fail("rotation size: " + rotate.status().to_string());
    settings.rotate_bytes = *rotate;
  }

  std::cerr << "attnkit bench: " << run.device_info.name << " (" << run.device << "), "
            << cases.size() << " cases x " << backends.size() << " backends, rotate "
            << (settings.rotate_bytes >> 20) << " MiB (" << run.rotate_why << ")"
            << (settings.graph
                    ? ", CUDA-graph replays of max(" + std::to_string(settings.launches) +
                          ", copies) forwards per sample (decode / verify cases only)"
                : settings.launches > 1
                    ? ", " + std::to_string(settings.launches) + " back-to-back forwards per sample"
                    : std::string())
            << "\n";
  // Ceilings, measured before the cases in the same process.
  bench::CeilingRates rates;
  Result<bench::Ceiling> copy =
      device.is_cuda() ? bench::measure_cuda_copy(device.ordinal, kCudaCopyBytes, kCudaCopyReps)
                       : bench::measure_cpu_copy(cpu_copy_bytes(), kCpuCopyReps);
  if (!copy) cli_fail("copy-bandwidth ceiling: " + copy.status().to_string());
  run.ceilings.push_back(*copy);
  if (device.is_cpu()) {  // the read-only ceiling beside the copy (a decode only reads)
    Result<bench::Ceiling> read = bench::measure_cpu_read(cpu_copy_bytes(), kCpuCopyReps);
    if (read) {
      run.ceilings.push_back(*read);
    } else {
      std::cerr << "attnkit bench: no cpu_read ceiling: " << read.status().to_string() << "\n";
    }
  }
  // Kept for the paired rounds of the memory-bound cases (allocated once, first-touched here).
  std::optional<bench::CpuCopyProbe> probe;
  const bool any_memory_bound =
      std::any_of(cases.begin(), cases.end(),
                  [](const bench::BenchCase& c) { return bench::is_memory_bound(c); });
  if (settings.paired_rounds > 0 && any_memory_bound) {
    Result<bench::CpuCopyProbe> created = bench::CpuCopyProbe::create(cpu_copy_bytes());
    if (!created) cli_fail("paired copy probe: " + created.status().to_string());
    probe.emplace(std::move(*created));
    settings.copy_probe = &*probe;
  }
  rates.copy_name = copy->name;
  rates.copy_gbs = copy->gbs;
  std::optional<size_t> amx_index;  // the AMX peak before the cases in run.ceilings
  if (args.gemm_tflops > 0) {
    bench::Ceiling given;
    given.name = "gemm_given";
    given.method =
        "--gemm-tflops on the command line (e.g. gemm_bf16 of torch_peers.py in the "
        "same device command)";
    given.tflops = args.gemm_tflops;
    given.median_tflops = args.gemm_tflops;
    run.ceilings.push_back(given);
  } else if (device.is_cpu()) {
    // The vdpbf16ps peak where the backend's avx512_bf16 level runs (it also needs VBMI).
    Result<bench::Ceiling> peak = bench::measure_cpu_compute_peak(
        run.device_info.has_avx512_bf16 && run.device_info.has_avx512_vbmi,
        run.device_info.has_avx2, kCpuPeakReps);
    if (peak) {
      run.ceilings.push_back(*peak);
    } else {  // extend ratios stay empty; the rest of the run is still meaningful
      std::cerr << "attnkit bench: no compute ceiling: " << peak.status().to_string() << "\n";
    }
    // With AMX the tile unit's peak is the extend ceiling (pushed last: the ratios use it).
    if (run.device_info.has_amx_bf16) {
      Result<bench::Ceiling> amx =
          bench::measure_cpu_amx_peak(run.device_info.has_amx_bf16, kCpuAmxPeakReps);
      if (amx) {
        amx_index = run.ceilings.size();
        run.ceilings.push_back(*amx);
      } else {
        std::cerr << "attnkit bench: no AMX ceiling: " << amx.status().to_string() << "\n";
      }
    }
  }
  if (run.ceilings.back().tflops > 0) {
    rates.compute_name = run.ceilings.back().name;
    // The AMX peak's ratios use its median short pass: the best of 15 short passes can catch a
    // moment when the vCPUs' tile units are not shared (Xeon host 09:47Z, 16 threads: best 34.1,
    // median 21.5, worst 15.4 TFLOP/s in one process); every pass figure stays in the method.
    const bench::Ceiling& peak = run.ceilings.back();
    rates.compute_tflops = bench::compute_ceiling_tflops(peak);
    // Paired rounds of the compute-bound cases against passes of the same ceiling (not a given
    // --gemm-tflops, which nothing here measures).
    if (device.is_cpu() && peak.name != "gemm_given") settings.paired_peak = peak.name;
  }
  std::cout << "# " << run.device_info.name << " " << run.device << ", " << run.date << "\n";
  for (const bench::Ceiling& c : run.ceilings) {
    std::cout << "# ceiling " << c.name << ": "
              << (c.gbs > 0 ? std::to_string(c.gbs) + " GB/s"
                            : std::to_string(c.tflops) + " TFLOP/s")
              << " (" << c.method << ")\n";
  }
  std::cout << bench::table_header(name_width) << "\n" << std::flush;

  const size_t total = cases.size() * backends.size();
  size_t done = 0;
  int failures = 0;
  for (const BackendDescriptor* d : backends) {
    for (const bench::BenchCase& c : cases) {
      ++done;
      std::cerr << "[" << done << "/" << total << "] " << d->name << " " << c.name << " ..."
                << std::endl;
      const auto t0 = std::chrono::steady_clock::now();
      bench::CaseResult r = bench::run_case(*d, c, settings, run.device_info, rates);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << "[" << done << "/" << total << "] " << bench::case_status_name(r.status)
                << " in " << seconds << " s" << std::endl;
      if (r.status == bench::CaseStatus::kFailed || r.status == bench::CaseStatus::kMismatch) {
        ++failures;
      }
      std::cout << bench::table_row(r, name_width) << "\n" << std::flush;
      run.results.push_back(std::move(r));
    }
  }

  // The AMX peak again after the cases: the extend ratios above use the peak measured before
  // them; a host whose tile rate changed mode meanwhile shows it here (both stay in the JSON).
  if (device.is_cpu() && amx_index.has_value() && rates.compute_name == "cpu_amx_bf16_peak") {
    Result<bench::Ceiling> after =
        bench::measure_cpu_amx_peak(run.device_info.has_amx_bf16, kCpuAmxPeakReps);
    if (after) {
      after->name = "cpu_amx_bf16_peak_after";
      std::cout << "# ceiling " << after->name << ": " << after->tflops << " TFLOP/s ("
                << after->method << ")\n";
      for (const bench::CaseResult& r : run.results) {
        if (r.tflops > 0 && after->tflops > 0) {
          std::cout << "#   " << r.backend << " " << r.bench_case.name << ": " << r.tflops
                    << " TFLOP/s = " << 100.0 * r.tflops / rates.compute_tflops
                    << "% of the median pass before (the table's ratio), "
                    << 100.0 * r.tflops / run.ceilings[*amx_index].tflops
                    << "% of the best before, " << 100.0 * r.tflops / after->median_tflops
                    << "% of the median pass after, " << 100.0 * r.tflops / after->tflops
                    << "% of the best after\n";
        }
      }
      run.ceilings.push_back(*after);
    }
  }
  run.load_end = bench::host_load_average();
  if (device.is_cpu()) {
    std::cout << "# load average (1/5/15 min) at start " << run.load_start << ", at end "
              << run.load_end << " on " << run.device_info.cpu_threads << " hardware threads\n";
  }
  if (!args.json_path.empty()) {
    // Bytes that are not UTF-8 (a path or command line in another encoding) are written as U+FFFD
    // instead of failing the dump after the whole run.
    const Status s = bench::write_text_file(
        args.json_path,
        bench::to_json(run).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!s.is_ok()) cli_fail("--json: " + s.to_string());
    std::cerr << "wrote " << args.json_path << "\n";
  }
  if (!args.csv_path.empty()) {
    const Status s = bench::write_text_file(args.csv_path, bench::to_csv(run));
    if (!s.is_ok()) cli_fail("--csv: " + s.to_string());
    std::cerr << "wrote " << args.csv_path << "\n";
  }
  if (failures > 0) {
    std::cerr << "attnkit bench: " << failures << " case(s) failed or mismatched\n";
    throw CLI::RuntimeError(1);
  }
  // A run that timed nothing is not a benchmark (select_backends refuses the same per backend).
  const bool any_ran = std::any_of(run.results.begin(), run.results.end(), [](const auto& r) {
    return r.status == bench::CaseStatus::kOk;
  });
  if (!any_ran) {
    std::cerr << "attnkit bench: no case ran: all " << run.results.size()
              << " were skipped (each row says why)\n";
    throw CLI::RuntimeError(1);
  }
}

void run_main(const CLI::App& cmd, const RunArgs& args) {
  if (args.list_cases) {
    constexpr const char* kRunOptions[] = {"--backend", "--case",    "--device",
                                           "--verify",  "--save-kv", "--layers"};
    refuse_beside(cmd, kRunOptions, "--list-cases",
                  "--list-cases prints the case table and runs nothing");
    for (const harness::CaseSpec& c : harness::shared_case_table()) {
      std::cout << c.describe() << "\n";
    }
    return;
  }
  if (args.backend.empty() || args.case_arg.empty()) {
    cli_fail("run: --backend and --case are required (or --list-cases)");
  }
  harness::CaseSpec spec;
  const size_t first = args.case_arg.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && args.case_arg[first] == '{') {
    Result<harness::CaseSpec> parsed = bench::parse_case_spec_json(args.case_arg);
    if (!parsed) cli_fail("--case: " + parsed.status().to_string());
    spec = std::move(*parsed);
  } else {
    const harness::CaseSpec* found = harness::find_case(args.case_arg);
    if (found == nullptr) {
      cli_fail("--case \"" + args.case_arg +
               "\" is neither a JSON CaseSpec nor a name in the shared case table (see "
               "`attnkit run --list-cases`)");
    }
    spec = *found;
  }
  if (const Status s = harness::validate_case(spec); !s.is_ok()) {
    cli_fail("--case: " + s.to_string());
  }
  DeviceInfo info;
  const Device device = resolve_device(args.device, &info);
  Result<const BackendDescriptor*> d = builtin_registry().get(args.backend);
  if (!d) cli_fail("--backend: " + d.status().to_string());
  std::cout << "case:    " << spec.describe() << "\n"
            << "backend: " << (*d)->name << " on " << info.name << " (" << device.to_string()
            << ")\n";
  const std::string reason = harness::skip_reason(**d, spec, info);
  if (!reason.empty()) cli_fail((*d)->name + " cannot run " + spec.name + ": " + reason);

  if (spec.cross_attention && args.layers < 2) {
    cli_fail("--layers " + std::to_string(args.layers) + " is too few for " + spec.name +
             ": a cross-attention case runs self-attention on even layers and cross-attention on "
             "odd ones; give --layers 2 or more");
  }
  harness::PrepareOptions options;
  options.num_layers = args.layers;
  Result<harness::PreparedCase> prepared = harness::prepare_case(spec, device, options);
  if (!prepared) cli_fail("prepare_case: " + prepared.status().to_string());
  auto backend = harness::create_backend_for_case(**d, *prepared);
  if (!backend) cli_fail("create backend: " + backend.status().to_string());
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = harness::run_backend(**backend, *prepared, args.save_kv);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.is_ok()) cli_fail("run: " + s.to_string());
  std::cout << "ran:     " << prepared->layers.size() << " layers, save_kv "
            << (args.save_kv ? "on" : "off") << ", " << ms
            << " ms wall (first call, includes metadata; use `attnkit bench` for timings)\n";
  if (!args.verify) {
    std::cout << "verify:  not requested (--verify compares with the fp64 reference)\n";
    return;
  }
  Result<harness::Comparison> cmp = harness::compare_with_reference(*prepared);
  if (!cmp) cli_fail("compare_with_reference: " + cmp.status().to_string());
  harness::apply_backend_arithmetic(**backend, &*cmp);  // fa3's FP8 kernel: fp8 bounds
  std::cout << "verify:  " << (cmp->passed() ? "PASS" : "FAIL") << " " << cmp->summary() << "\n";
  if (!cmp->passed()) throw CLI::RuntimeError(1);
}

}  // namespace

void register_bench_commands(CLI::App& app) {
  auto bench_args = std::make_shared<BenchArgs>();
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Benchmark backends over a case file: optional verification against the fp64 reference, "
      "median time over rotating inputs, GB/s and TFLOP/s from bench/bench_formulas.h, the ratio "
      "to the measured copy bandwidth, table on stdout, JSON/CSV files");
  bench
      ->add_option("--backend", bench_args->backends,
                   "Backend flag name(s), comma-separated, or 'all' (every built backend for "
                   "the device)")
      ->required();
  bench->add_option("--cases", bench_args->cases, "Case file (bench/cases/*.json)")->required();
  bench
      ->add_option("--device", bench_args->device, "cpu, cuda or cuda:N (default: cuda if present)")
      ->check(cli::non_empty("cpu, cuda, cuda:N"));
  bench->add_flag("--verify", bench_args->verify,
                  "Compare each case with the fp64 reference once before timing; a mismatch "
                  "fails the case");
  bench->add_option("--json", bench_args->json_path, "Write the results as JSON (for plot.py)");
  bench->add_option("--csv", bench_args->csv_path, "Write the results as CSV");
  bench
      ->add_option("--warmup", bench_args->warmup,
                   "Untimed calls before timing (default: CPU " + std::to_string(kCpuWarmup) +
                       ", CUDA " + std::to_string(kCudaWarmup) + ")")
      ->transform(cli::integer_in_range(0, kMaxCalls));
  bench
      ->add_option("--iters", bench_args->iters,
                   "Timed calls; the median is reported "
                   "(default: CPU " +
                       std::to_string(kCpuIters) + ", CUDA " + std::to_string(kCudaIters) + ")")
      ->transform(cli::integer_in_range(1, kMaxCalls));
  bench
      ->add_option("--launches", bench_args->launches,
                   "CUDA: forwards enqueued back to back per timed sample, time divided by it "
                   "(default 1: one forward, host launch latency included; refused with --device "
                   "cpu, which times one forward per sample)")
      ->transform(cli::positive_int());
  bench->add_flag(
      "--graph", bench_args->graph,
      "CUDA, decode and verify cases: time replays of one CUDA graph captured through the "
      "backend's graph API (as a serving engine runs decode), holding max(--launches, rotating "
      "copies) forwards, time divided by that count; other cases are skipped");
  bench
      ->add_option("--paired-rounds", bench_args->paired_rounds,
                   "CPU: after the timed calls, rounds of one ceiling reading followed by "
                   "--paired-calls forwards (memory-bound cases: a copy pass; compute-bound "
                   "ones: passes of the compute peak, unless --gemm-tflops gives it); the ratio "
                   "to it is reported per round and as the median (default " +
                       std::to_string(kCpuPairedRounds) + ", 0 = off, at most " +
                       std::to_string(kMaxPairedRounds) + ")")
      ->transform(cli::integer_in_range(0, kMaxPairedRounds));
  bench
      ->add_option("--paired-calls", bench_args->paired_calls,
                   "CPU: forwards per paired round (their median is compared with the round's "
                   "ceiling reading); fewer where a case's rounds would take more than "
                   "--paired-max-seconds at its timed median, and no rounds where one call per "
                   "round would (the row and the JSON's paired_note say so)")
      ->transform(cli::integer_in_range(1, kMaxCalls));
  bench
      ->add_option("--paired-max-seconds", bench_args->paired_max_seconds,
                   "CPU: the most one case's paired forwards may take, estimated from its timed "
                   "median (default " +
                       std::to_string(static_cast<int>(bench::kPairedMaxSeconds)) + ")")
      ->check(cli::number_in_range(kMinPairedSeconds, kMaxPairedSeconds));
  bench->add_option("--filter", bench_args->filter, "Only cases whose name contains this");
  bench
      ->add_option("--rotate-mib", bench_args->rotate_mib,
                   "Bytes the rotating input copies must exceed, in MiB (default: CPU max(2 x "
                   "LLC, 256 MiB), CUDA 2 x L2)")
      ->transform(cli::positive_int());
  // Each rotating copy is a layer of the case's KV pool.
  bench->add_option("--max-copies", bench_args->max_copies, "Cap on rotating copies per case")
      ->transform(cli::integer_in_range(1, kMaxPoolLayers));
  bench
      ->add_option("--gemm-tflops", bench_args->gemm_tflops,
                   "Compute ceiling for extend ratios, in TFLOP/s (default: CPU measures its "
                   "AMX tile peak, else its vector peak; CUDA has none unless given, e.g. "
                   "torch_peers.py's gemm_bf16)")
      ->check(cli::number_in_range(kMinGemmTflops, kMaxGemmTflops));
  // --list runs nothing, so options that only act on a run (kRunOnlyOptions) are refused beside a
  // true --list in bench_main (they were silently ignored).
  bench->add_flag("--list", bench_args->list, "Print the (filtered) case names and exit");
  bench->callback([bench, bench_args] { bench_main(*bench, *bench_args); });

  auto run_args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand(
      "run", "Run one case (a JSON CaseSpec or a name from the shared case table) on one backend");
  run->add_option("--backend", run_args->backend, "Backend flag name")
      ->check(cli::non_empty("a backend flag name, see `attnkit backends`"));
  run->add_option("--case", run_args->case_arg,
                  "A name from the shared case table or a JSON CaseSpec ('{\"mode\": \"decode\", "
                  "\"prefix_lens\": [100], ...}')")
      ->check(cli::non_empty("a case name (`attnkit run --list-cases`) or a JSON CaseSpec"));
  run->add_option("--device", run_args->device, "cpu, cuda or cuda:N (default: cuda if present)")
      ->check(cli::non_empty("cpu, cuda, cuda:N"));
  run->add_flag("--verify", run_args->verify, "Compare with the fp64 reference and print it");
  run->add_flag("--save-kv", run_args->save_kv,
                "Let the backend write the new k/v (default: the runner writes them)");
  run->add_option("--layers", run_args->layers, "Layers with independent data")
      ->transform(cli::integer_in_range(1, kMaxPoolLayers));
  // A true --list-cases runs nothing, so the run's options are refused beside it in run_main
  // (CLI11's excludes() also refused them beside --list-cases=false).
  run->add_flag("--list-cases", run_args->list_cases, "List the shared case table and exit");
  run->callback([run, run_args] { run_main(*run, *run_args); });
}

}  // namespace attnkit
