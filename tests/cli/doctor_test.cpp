// `backprop doctor` end to end: real error texts from public bug reports (tests/cli/data/doctor,
// sources in SOURCES.md) are fed to the command, and the diagnosis, the extracted numbers and the
// analyzers' verdicts are checked. Also: this tool's own errors for every catalog code (text and
// JSON envelope), unrecognised input, stdin, a missing file, several problems in one log, and
// docs/troubleshooting.md being up to date.
// GCC 12 at -O3 reports a false -Wrestrict on `"literal" + std::string` (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/error_report.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string data_path(const std::string& name) {
  return test::source_dir() + "/tests/cli/data/doctor/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `backprop doctor <args> --json` (stderr dropped) and parses the report.
nlohmann::json doctor_json(const std::string& args, int* rc_out = nullptr) {
  std::string out;
  int rc = test::run_command("( '" + test::backprop_exe() + "' doctor " + args + " --json 2>/dev/null )", &out);
  if (rc_out) *rc_out = rc;
  EXPECT_EQ(rc, 0) << out;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << e.what() << "\n" << out;
    return nlohmann::json::object();
  }
}

nlohmann::json doctor_file(const std::string& name) {
  return doctor_json("'" + data_path(name) + "'");
}

nlohmann::json doctor_text(const std::string& text) {
  test::TempDir dir;
  std::string path = dir.path + "/input.txt";
  std::ofstream(path, std::ios::binary) << text;
  return doctor_json("'" + path + "'");
}

const nlohmann::json& first(const nlohmann::json& r) {
  static const nlohmann::json empty = nlohmann::json::object();
  if (!r.contains("matches") || r.at("matches").empty()) {
    ADD_FAILURE() << "no match in " << r.dump(2);
    return empty;
  }
  return r.at("matches").at(0);
}

std::vector<std::string> ids(const nlohmann::json& r) {
  std::vector<std::string> v;
  for (const auto& m : r.value("matches", nlohmann::json::array())) v.push_back(m.at("id").get<std::string>());
  return v;
}

std::string num_text(const nlohmann::json& m, const std::string& name) {
  if (!m.contains("numbers") || !m.at("numbers").contains(name)) return "<missing " + name + ">";
  return m.at("numbers").at(name).at("text").get<std::string>();
}
long long num_value(const nlohmann::json& m, const std::string& name) {
  if (!m.contains("numbers") || !m.at("numbers").contains(name)) {
    ADD_FAILURE() << "missing number " << name << " in " << m.dump(2);
    return -1;
  }
  return m.at("numbers").at(name).at("value").get<long long>();
}
bool has_flag(const nlohmann::json& m, const std::string& flag) {
  for (const auto& f : m.value("fixes", nlohmann::json::array()))
    if (!f.at("flag").is_null() && f.at("flag").get<std::string>().rfind(flag, 0) == 0) return true;
  return false;
}
bool has_fix_text(const nlohmann::json& m, const std::string& needle) {
  for (const auto& f : m.value("fixes", nlohmann::json::array()))
    if (f.at("text").get<std::string>().find(needle) != std::string::npos) return true;
  return false;
}
bool analysis_mentions(const nlohmann::json& m, const std::string& needle) {
  for (const auto& l : m.value("analysis", nlohmann::json::array()))
    if (l.get<std::string>().find(needle) != std::string::npos) return true;
  return false;
}
constexpr double GiB = 1073741824.0, MiB = 1048576.0;
long long bytes(double v, double unit) {
  return std::llround(v * unit);
}

// ---- CUDA out of memory, old message ("(GPU 0; X total capacity; Y already allocated; ...)") ------

TEST(Doctor, OldOomFreeExceedsRequest) {  // pytorch/pytorch#59778
  auto m = first(doctor_file("oom_old_pytorch_59778.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  EXPECT_EQ(num_value(m, "requested"), bytes(2.26, GiB));
  EXPECT_EQ(num_value(m, "total_capacity"), bytes(6.00, GiB));
  EXPECT_EQ(num_value(m, "allocated"), bytes(781.59, MiB));
  EXPECT_EQ(num_value(m, "free"), bytes(3.03, GiB));
  EXPECT_EQ(num_value(m, "reserved"), bytes(1.24, GiB));
  // reserved - allocated, computed by the analyzer
  EXPECT_NEAR(num_value(m, "reserved_unallocated"), 1.24 * GiB - 781.59 * MiB, 1.0);
  EXPECT_TRUE(m.at("numbers").at("reserved_unallocated").value("derived", false));
  EXPECT_EQ(m.at("verdict"), "free_exceeds_request");
}

TEST(Doctor, OldOomLargerThanDevice) {  // YingqianWang/iPASSR#9
  auto m = first(doctor_file("oom_old_ipassr_9.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  EXPECT_EQ(num_text(m, "requested"), "10.73 GiB");
  EXPECT_EQ(num_text(m, "total_capacity"), "8.00 GiB");
  EXPECT_EQ(num_text(m, "free"), "0 bytes");
  EXPECT_EQ(num_value(m, "free"), 0);
  EXPECT_EQ(m.at("verdict"), "larger_than_device");
  EXPECT_TRUE(analysis_mentions(m, "more than the device's total"));  // 17.20 GiB allocated on an 8 GiB card
}

TEST(Doctor, OldOomExhaustion) {  // microsoft/unilm#137
  auto m = first(doctor_file("oom_old_unilm_137.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  EXPECT_EQ(num_text(m, "requested"), "128.00 MiB");
  EXPECT_NEAR(num_value(m, "reserved_unallocated"), 10.86 * GiB - 10.85 * GiB, 1.0);  // 10.24 MiB
  EXPECT_EQ(m.at("verdict"), "exhaustion");
  EXPECT_TRUE(has_flag(m, "--micro-batch-size"));
  EXPECT_TRUE(has_flag(m, "--grad-accum"));
  EXPECT_TRUE(has_flag(m, "--max-seq-length"));
  EXPECT_TRUE(has_flag(m, "--gradient-checkpointing"));
  EXPECT_TRUE(has_flag(m, "--mode lora"));
  EXPECT_TRUE(has_flag(m, "--base-dtype q4_k"));  // QLoRA: the frozen base held at 4 bits
  EXPECT_FALSE(has_flag(m, "--max-memory"));      // that fix is for backprop's own CPU budget
}

TEST(Doctor, OldOomWrappedAcrossLines) {  // bitsandbytes-foundation/bitsandbytes#758
  auto m = first(doctor_file("oom_old_wrapped_bitsandbytes_758.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  EXPECT_EQ(num_text(m, "allocated"), "12.19 GiB");  // "already\nallocated"
  EXPECT_EQ(num_text(m, "reserved"), "12.68 GiB");
  EXPECT_EQ(m.at("verdict"), "exhaustion");
}

// ---- CUDA out of memory, new message ("GPU 0 has a total capacity of ... of which ... is free") ----

TEST(Doctor, NewOomFragmentationWithTypo) {  // carolchenyx/MGFN.#35 ("total capacty")
  auto m = first(doctor_file("oom_new_typo_mgfn_35.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  EXPECT_EQ(num_text(m, "total_capacity"), "6.00 GiB");
  EXPECT_EQ(num_text(m, "reserved_unallocated"), "2.30 GiB");
  EXPECT_EQ(num_value(m, "reserved"), bytes(2.93, GiB) + bytes(2.30, GiB));  // allocated + unallocated
  EXPECT_EQ(m.at("verdict"), "fragmentation");
  // expandable_segments is the first (cheapest) fix for fragmentation
  EXPECT_NE(m.at("fixes").at(0).at("text").get<std::string>().find("expandable_segments"), std::string::npos);
}

TEST(Doctor, NewOomExhaustionWithLargeCache) {  // murong-xu/CADS#4
  auto m = first(doctor_file("oom_new_cads_4.txt"));
  EXPECT_EQ(num_text(m, "requested"), "22.78 GiB");
  EXPECT_EQ(num_text(m, "free"), "12.73 GiB");
  EXPECT_EQ(num_text(m, "process_in_use"), "18.73 GiB");
  EXPECT_EQ(num_text(m, "allocated"), "9.08 GiB");
  EXPECT_EQ(num_text(m, "reserved_unallocated"), "9.35 GiB");
  // 9.35 cached + 12.73 free = 22.08 GiB < 22.78 GiB: exhaustion even if defragmented
  EXPECT_EQ(m.at("verdict"), "exhaustion");
  EXPECT_TRUE(analysis_mentions(m, "short of"));
  EXPECT_TRUE(has_flag(m, "--micro-batch-size"));
}

TEST(Doctor, NewOomExhaustionSmallCache) {  // qingze-bai/VSmTrans#3
  auto m = first(doctor_file("oom_new_exhausted_vsmtrans_3.txt"));
  EXPECT_EQ(num_text(m, "requested"), "226.00 MiB");
  EXPECT_EQ(num_text(m, "free"), "210.38 MiB");
  EXPECT_EQ(m.at("verdict"), "exhaustion");
  EXPECT_EQ(m.at("fixes").at(0).at("text").get<std::string>().find("expandable_segments"), std::string::npos);
}

TEST(Doctor, NewOomOtherProcesses) {  // huggingface/trl#5207
  auto m = first(doctor_file("oom_new_other_processes_trl_5207.txt"));
  EXPECT_EQ(m.at("id"), "cuda-oom");
  // 284.00 MiB + 3.40 GiB + 258.00 MiB + 10.77 GiB held by four processes
  EXPECT_EQ(m.at("numbers").at("other_processes").at("count"), 4);
  EXPECT_EQ(num_value(m, "other_processes"), std::llround(284.0 * MiB + 3.40 * GiB + 258.0 * MiB + 10.77 * GiB));
  EXPECT_TRUE(has_flag(m, "--device"));
}

TEST(Doctor, OomLogitsSizedAllocation) {  // mgmalek/efficient_cross_entropy#9
  auto m = first(doctor_file("oom_logits_efficient_ce_9.txt"));
  EXPECT_EQ(num_text(m, "requested"), "17.37 GiB");
  // 30688 tokens x 151936 vocab x 4 bytes = 18,650,447,872 bytes = 17.37 GiB
  EXPECT_EQ(num_value(m, "logits_tokens"), 30688);
  EXPECT_EQ(num_value(m, "logits_vocab"), 151936);
  EXPECT_EQ(num_value(m, "logits_bytes_per_element"), 4);
  EXPECT_TRUE(analysis_mentions(m, "18,650,447,872"));
  EXPECT_EQ(m.at("verdict"), "exhaustion");
}

TEST(Doctor, LogitsEstimatedFromVocabularyInLog) {
  // Constructed: 8 x 2048 tokens x 128256 vocab x 4 bytes = 7.83 GiB, vocab_size in the config dump.
  auto m = first(doctor_text(
      "config: {\"vocab_size\": 128256}\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total capacity of 23.65 GiB "
      "of which 5.10 GiB is free. Of the allocated memory 17.90 GiB is allocated by PyTorch, and 194.87 MiB is "
      "reserved by PyTorch but unallocated.\n"));
  EXPECT_EQ(num_value(m, "logits_vocab"), 128256);
  EXPECT_EQ(num_value(m, "logits_tokens"), 16384);
  EXPECT_TRUE(analysis_mentions(m, "Possibly logits"));
}

TEST(Doctor, NoLogitsClaimWithoutEvidence) {  // pytorch/pytorch#59778: nothing points at logits
  auto m = first(doctor_file("oom_old_pytorch_59778.txt"));
  EXPECT_FALSE(m.at("numbers").contains("logits_tokens"));
}

// ---- other CUDA / library errors ---------------------------------------------------------------------

struct Case {
  const char* file;
  const char* id;
};

class DoctorRealText : public ::testing::TestWithParam<Case> {};

TEST_P(DoctorRealText, FirstMatchIs) {
  auto r = doctor_file(GetParam().file);
  EXPECT_TRUE(r.value("recognised", false));
  EXPECT_EQ(first(r).at("id"), GetParam().id) << r.dump(2);
}

INSTANTIATE_TEST_SUITE_P(Texts, DoctorRealText,
                         ::testing::Values(Case{"cublas_alloc_failed_qwen3_873.txt", "cublas-alloc-failed"},
                                           Case{"cublas_execution_failed_dpt_4.txt", "cublas-execution-failed"},
                                           Case{"cudnn_not_initialized_clrnet_94.txt", "cudnn-status"},
                                           Case{"device_assert_labels_reid_372.txt", "device-side-assert"},
                                           Case{"device_assert_index_transformers_28104.txt", "device-side-assert"},
                                           Case{"device_assert_bare_widedeep_186.txt", "device-side-assert"},
                                           Case{"illegal_memory_access_evo_136.txt", "illegal-memory-access"},
                                           Case{"nccl_watchdog_llamafactory_7396.txt", "nccl-timeout"},
                                           Case{"nccl_unhandled_cuda_nccl_1410.txt", "nccl-unhandled-cuda"},
                                           Case{"nccl_no_route_hkproj_1.txt", "no-route-to-host"},
                                           Case{"store_barrier_megatron_782.txt", "ranks-not-responding"},
                                           Case{"rendezvous_refused_pytorch_79388.txt", "rendezvous-failed"},
                                           Case{"address_in_use_tuneavideo_90.txt", "address-in-use"},
                                           Case{"address_in_use_eaddrinuse_vlmr1_289.txt", "address-in-use"},
                                           Case{"same_device_fastnn_1.txt", "tensors-different-devices"},
                                           Case{"driver_too_old_fooocus_1313.txt", "driver-too-old"},
                                           Case{"driver_insufficient_yolov3_12.txt", "driver-too-old"},
                                           Case{"no_driver_simcse_244.txt", "cuda-not-available"},
                                           Case{"hf_gated_401_mlx_759.txt", "hf-gated"},
                                           Case{"hf_404_chatpdf_5.txt", "hf-not-found"},
                                           Case{"ollama_refused_206.txt", "ollama-unreachable"},
                                           Case{"ollama_refused_python_3200.txt", "ollama-unreachable"},
                                           Case{"disk_full_llamafactory_5155.txt", "disk-full"},
                                           Case{"nan_loss_cookbook_300.txt", "nan-loss"},
                                           Case{"fp16_overflow_apex_715.txt", "fp16-overflow"},
                                           Case{"xla_recompile_xla_2511.txt", "xla-recompilation"},
                                           Case{"xla_compile_slow_xla_3354.txt", "xla-recompilation"},
                                           Case{"cuda_runtime_oom_unsloth_1552.txt", "cuda-runtime-oom"},
                                           Case{"cublas_not_initialized_tf_9489.txt", "cublas-not-initialized"},
                                           Case{"hf_401_not_found_nerzh_1.txt", "hf-unauthorized"},
                                           Case{"nccl_system_error_nccl_375.txt", "nccl-system-error"}));

// Every entry of the data file is recognised by at least one real text (plus one constructed text
// for the generic CUDA fallback, which by design gives way to every specific CUDA entry).
TEST(Doctor, EveryDataEntryHasATest) {
  std::set<std::string> hit;
  for (const auto& f : std::filesystem::directory_iterator(test::source_dir() + "/tests/cli/data/doctor")) {
    if (f.path().extension() != ".txt") continue;
    for (const auto& id : ids(doctor_json("'" + f.path().string() + "'"))) hit.insert(id);
  }
  auto generic = doctor_text("RuntimeError: CUDA error: no kernel image is available for execution on the device\n");
  EXPECT_EQ(num_text(first(generic), "message"), "no kernel image is available for execution on the device");
  for (const auto& id : ids(generic)) hit.insert(id);
  auto data = nlohmann::json::parse(read_file(test::source_dir() + "/data/troubleshooting.json"));
  for (const auto& e : data.at("entries")) EXPECT_TRUE(hit.count(e.at("id").get<std::string>())) << e.at("id");
}

TEST(Doctor, CublasExecutionFailedReadsDtype) {  // isl-org/DPT#4
  auto m = first(doctor_file("cublas_execution_failed_dpt_4.txt"));
  EXPECT_EQ(num_text(m, "call"), "cublasGemmEx");
  EXPECT_EQ(num_text(m, "data_type"), "CUDA_R_16F");
  EXPECT_TRUE(analysis_mentions(m, "fp16"));
}

TEST(Doctor, CudnnStatusExplained) {  // Turoad/CLRNet#94
  auto m = first(doctor_file("cudnn_not_initialized_clrnet_94.txt"));
  EXPECT_EQ(num_text(m, "status"), "CUDNN_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(m.at("verdict"), "CUDNN_STATUS_NOT_INITIALIZED");
  EXPECT_TRUE(analysis_mentions(m, "out of memory"));
}

TEST(Doctor, DeviceAssertLabelsVsIndices) {
  auto labels = first(doctor_file("device_assert_labels_reid_372.txt"));  // layumi/Person_reID_baseline_pytorch#372
  EXPECT_EQ(num_text(labels, "assertion"), "t >= 0 && t < n_classes");
  EXPECT_EQ(num_value(labels, "failed_threads"), 3);
  EXPECT_TRUE(analysis_mentions(labels, "target label"));
  auto index = first(doctor_file("device_assert_index_transformers_28104.txt"));  // huggingface/transformers#28104
  EXPECT_EQ(num_text(index, "assertion"), "srcIndex < srcSelectDimSize");
  EXPECT_EQ(num_text(index, "kernel"), "indexSelectLargeIndex");
  EXPECT_TRUE(analysis_mentions(index, "token id"));
  EXPECT_TRUE(has_flag(index, "--device cpu"));
}

TEST(Doctor, NcclWatchdogNumbers) {  // hiyouga/LlamaFactory#7396
  auto m = first(doctor_file("nccl_watchdog_llamafactory_7396.txt"));
  EXPECT_EQ(num_text(m, "op_type"), "ALLREDUCE");
  EXPECT_EQ(num_value(m, "timeout_ms"), 600000);
  EXPECT_EQ(num_value(m, "ran_for_ms"), 600060);
  EXPECT_EQ(num_value(m, "seq_num"), 1580);
  EXPECT_EQ(num_value(m, "numel"), 466119168);
  EXPECT_EQ(num_value(m, "last_completed"), 1579);
  EXPECT_EQ(m.at("numbers").at("ranks_reporting").at("count"), 2);  // ranks 0 and 4
  EXPECT_TRUE(analysis_mentions(m, "10.0 minutes"));
  EXPECT_TRUE(analysis_mentions(m, "1.74 GiB"));  // 466119168 x 4 bytes
}

TEST(Doctor, NcclUnhandledCudaError) {  // NVIDIA/nccl#1410
  auto m = first(doctor_file("nccl_unhandled_cuda_nccl_1410.txt"));
  EXPECT_EQ(num_text(m, "nccl_version"), "2.20.5");
  EXPECT_EQ(num_text(m, "cuda_failure"), "1 'invalid argument'");
  EXPECT_TRUE(analysis_mentions(m, "same GPU"));
}

// A rank of a data-parallel run killed: mpirun's own line (open-mpi/ompi#2661), and the coded line
// backprop's surviving rank prints, both name the rank, its host and the signal where they say it.
TEST(Doctor, DataParallelRankLost) {
  auto m = first(doctor_file("mpirun_rank_killed_ompi_2661.txt"));
  EXPECT_EQ(m.at("id"), "distributed-rank-lost");
  EXPECT_EQ(num_value(m, "lost_rank"), 0);
  EXPECT_EQ(num_text(m, "host"), "host01");
  EXPECT_EQ(num_value(m, "signal"), 9);
  auto own = first(doctor_text(
      "[ERROR] [RUNTIME_DISTRIBUTED_RANK_LOST] [collective] rank 1 of 2 (pid 4242 on host node7) is gone: killed or "
      "crashed (all-to-all waited for it: MPI_Ialltoallv abandoned after 0.1 s); rank 0 stops the run instead of "
      "waiting for it; the last saved checkpoint is runs/x/checkpoints/checkpoint-2 (step 2): continue from it with "
      "--resume latest\n"));
  EXPECT_EQ(own.at("id"), "distributed-rank-lost");
  EXPECT_EQ(num_value(own, "lost_rank"), 1);
  EXPECT_EQ(num_text(own, "host"), "node7");
}

TEST(Doctor, NoRouteToHostHidesGenericSystemError) {  // hkproj/pytorch-transformer-distributed#1
  auto r = doctor_file("nccl_no_route_hkproj_1.txt");
  auto v = ids(r);
  EXPECT_EQ(std::count(v.begin(), v.end(), "nccl-system-error"), 0);
  EXPECT_EQ(num_text(first(r), "peer"), "192.168.19.14<52822>");
}

TEST(Doctor, StoreBarrierRanksMissing) {  // NVIDIA/Megatron-LM#782
  auto m = first(doctor_file("store_barrier_megatron_782.txt"));
  EXPECT_EQ(num_value(m, "world_size"), 2);
  EXPECT_EQ(num_value(m, "worker_count"), 1);
  EXPECT_EQ(m.at("verdict"), "ranks_missing");
  auto ranks = first(doctor_text("2 ranks but only 1 are responding\n"));  // the other wording
  EXPECT_EQ(ranks.at("id"), "ranks-not-responding");
  EXPECT_EQ(num_value(ranks, "world_size"), 2);
  EXPECT_EQ(num_value(ranks, "worker_count"), 1);
}

TEST(Doctor, AddressInUsePort) {
  EXPECT_EQ(num_value(first(doctor_file("address_in_use_tuneavideo_90.txt")), "port"),
            29500);  // showlab/Tune-A-Video#90
  EXPECT_EQ(num_value(first(doctor_file("address_in_use_eaddrinuse_vlmr1_289.txt")), "port"),
            29500);  // om-ai-lab/VLM-R1#289
}

TEST(Doctor, SameDeviceNumbers) {  // wmyw96/FAST-NN#1
  auto m = first(doctor_file("same_device_fastnn_1.txt"));
  EXPECT_EQ(num_text(m, "device_a"), "cpu");
  EXPECT_EQ(num_text(m, "device_b"), "cuda:0");
  EXPECT_EQ(num_text(m, "argument"), "mat2");
  EXPECT_EQ(num_text(m, "method"), "wrapper_mm");
}

TEST(Doctor, DriverVersionDecoded) {  // lllyasviel/Fooocus#1313
  auto m = first(doctor_file("driver_too_old_fooocus_1313.txt"));
  EXPECT_EQ(num_value(m, "driver_cuda_version"), 11040);
  EXPECT_EQ(num_text(m, "driver_cuda"), "11.4");
}

TEST(Doctor, HubErrors) {
  auto gated = doctor_file("hf_gated_401_mlx_759.txt");  // ml-explore/mlx-examples#759
  EXPECT_EQ(num_text(first(gated), "repo"), "mistralai/Mistral-7B-Instruct-v0.2");
  EXPECT_EQ(num_value(first(gated), "http_status"), 401);
  auto v = ids(gated);
  EXPECT_EQ(std::count(v.begin(), v.end(), "hf-unauthorized"), 0);  // gated is the specific reading
  auto missing = first(doctor_file("hf_404_chatpdf_5.txt"));        // AIAnytime/Chat-with-PDF-Chatbot#5
  EXPECT_EQ(num_text(missing, "repo"), "LaMini-T5-738M");
  EXPECT_EQ(missing.at("verdict"), "missing_owner");
}

TEST(Doctor, OllamaPort) {  // ollama/ollama#206 and #3200
  EXPECT_EQ(num_value(first(doctor_file("ollama_refused_206.txt")), "port"), 11434);
  auto m = first(doctor_file("ollama_refused_python_3200.txt"));
  EXPECT_EQ(num_text(m, "host"), "localhost");
  EXPECT_TRUE(has_flag(m, "--ollama-host"));
}

TEST(Doctor, NanLossVerdicts) {
  auto plain = first(doctor_file("nan_loss_cookbook_300.txt"));  // meta-llama/llama-cookbook#300
  EXPECT_EQ(plain.at("verdict"), "data_or_unknown");
  EXPECT_FALSE(has_fix_text(plain, "instead of fp16"));
  EXPECT_TRUE(has_flag(plain, "--max-grad-norm"));
  auto fp16 = first(doctor_text("--fp16 --learning_rate 2e-6\n{'loss': nan, 'learning_rate': 2e-06, 'epoch': 0.1}\n"));
  EXPECT_EQ(fp16.at("id"), "nan-loss");
  EXPECT_EQ(fp16.at("verdict"), "fp16_overflow");
  EXPECT_TRUE(has_fix_text(fp16, "instead of fp16"));
  auto lr = first(doctor_text("step 120: loss = nan, lr = 0.01\n"));
  EXPECT_EQ(lr.at("verdict"), "learning_rate");
}

TEST(Doctor, LossScaleCollapsed) {  // NVIDIA/apex#715
  auto m = first(doctor_file("fp16_overflow_apex_715.txt"));
  EXPECT_EQ(num_value(m, "overflow_steps"), 3);
  EXPECT_EQ(num_text(m, "loss_scale"), "3.645561009778199e-304");
  EXPECT_EQ(m.at("verdict"), "collapsed");
}

TEST(Doctor, XlaStorm) {  // pytorch/xla#2511
  auto m = first(doctor_file("xla_recompile_xla_2511.txt"));
  EXPECT_EQ(num_value(m, "compilations"), 500);
  EXPECT_EQ(num_value(m, "step"), 5);
  EXPECT_EQ(m.at("verdict"), "recompilation_storm");
}

// ---- several problems, unrecognised input, input handling ------------------------------------------------

TEST(Doctor, SeveralProblemsMostSpecificFirst) {
  std::string log = read_file(data_path("nccl_watchdog_llamafactory_7396.txt")) +
                    read_file(data_path("oom_new_exhausted_vsmtrans_3.txt")) +
                    read_file(data_path("disk_full_llamafactory_5155.txt"));
  auto v = ids(doctor_text(log));
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], "cuda-oom");  // rank 90, then rank 85 in order of appearance
  EXPECT_EQ(v[1], "nccl-timeout");
  EXPECT_EQ(v[2], "disk-full");
}

TEST(Doctor, UnrecognisedIsHonest) {
  auto r = doctor_text("epoch 3 finished, eval accuracy 0.91, saving to out/\n");
  EXPECT_FALSE(r.at("recognised").get<bool>());
  EXPECT_TRUE(r.at("matches").empty());
  EXPECT_FALSE(r.at("generic_first_steps").empty());
  test::TempDir dir;
  std::ofstream(dir.path + "/x.txt") << "all good\n";
  std::string out;
  EXPECT_EQ(test::run_command("'" + test::backprop_exe() + "' doctor '" + dir.path + "/x.txt'", &out), 0);
  EXPECT_NE(out.find("not recognised"), std::string::npos) << out;
  EXPECT_NE(out.find("CUDA_LAUNCH_BLOCKING=1"), std::string::npos) << out;  // a generic first step
}

TEST(Doctor, ReadsStdin) {
  std::string path = data_path("address_in_use_tuneavideo_90.txt");
  auto dash = doctor_json("- < '" + path + "'");
  EXPECT_EQ(first(dash).at("id"), "address-in-use");
  std::string out;
  ASSERT_EQ(test::run_command("cat '" + path + "' | '" + test::backprop_exe() + "' doctor", &out), 0);
  EXPECT_NE(out.find("Address already in use (a port is taken)"), std::string::npos) << out;
}

TEST(Doctor, MissingFileIsInputError) {
  std::string out;
  int rc = test::run_command("'" + test::backprop_exe() + "' doctor /nonexistent/log.txt", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("[ERROR] [INPUT_VALIDATION_FAILED]"), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/log.txt"), std::string::npos) << out;
  test::TempDir dir;
  std::ofstream(dir.path + "/empty.txt") << "\n\n";
  rc = test::run_command("'" + test::backprop_exe() + "' doctor '" + dir.path + "/empty.txt' --json", &out);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("\"INPUT_VALIDATION_FAILED\""), std::string::npos) << out;
}

TEST(Doctor, HumanOutputShowsNumbersAndFlags) {  // carolchenyx/MGFN.#35
  std::string out;
  ASSERT_EQ(
      test::run_command("'" + test::backprop_exe() + "' doctor '" + data_path("oom_new_typo_mgfn_35.txt") + "'", &out),
      0);
  EXPECT_NE(out.find("Verdict: fragmentation"), std::string::npos) << out;
  EXPECT_NE(out.find("2.30 GiB"), std::string::npos);
  EXPECT_NE(out.find("Fixes (least effort first)"), std::string::npos);
}

// ---- this tool's own errors ---------------------------------------------------------------------------------

TEST(Doctor, OwnOutOfMemoryErrorAnalysed) {
  OutOfMemoryError e("cpu", size_t{2} << 30, size_t{5} << 30, size_t{512} << 20, size_t{6} << 30, size_t{16} << 30);
  for (const std::string& text : {render_error_text(e, "run-1"), render_error_json(e, "run-1").dump(2)}) {
    auto m = first(doctor_text(text));
    EXPECT_EQ(m.at("id"), "cuda-oom") << text;
    EXPECT_EQ(m.at("code"), "RUNTIME_CPU_OOM") << "the CPU allocator's own error";
    EXPECT_EQ(num_value(m, "requested"), int64_t{2} << 30);
    EXPECT_EQ(num_value(m, "limit"), int64_t{6} << 30);
    EXPECT_EQ(num_value(m, "reserved_unallocated"), int64_t{512} << 20);
    EXPECT_TRUE(has_flag(m, "--max-memory"));
  }
}

TEST(Doctor, EveryCatalogCodeRecognisedInTextAndJson) {
  std::string log;
  for (const auto& info : error_catalog()) {
    Error e(info.code, std::string("[test] something about ") + info.name);
    log += render_error_text(e, "") + render_error_json(e, "").dump(2) + "\n";
  }
  auto r = doctor_text(log);
  std::set<std::string> codes, ids;
  for (const auto& m : r.at("matches")) {
    ids.insert(m.at("id").get<std::string>());
    if (!m.at("code").is_null()) codes.insert(m.at("code").get<std::string>());
  }
  // An entry that serves two codes (cuda-oom: RUNTIME_GPU_OOM and RUNTIME_CPU_OOM) matches once in a
  // log holding both and names one of them; the other counts when its own diagnosis is that entry.
  for (const auto& info : error_catalog()) {
    if (codes.count(info.name)) continue;
    const auto alone = first(doctor_text(render_error_json(Error(info.code, "[test] x"), "").dump()));
    EXPECT_TRUE(alone.at("code") == info.name && ids.count(alone.at("id").get<std::string>())) << info.name;
  }
  // and one at a time, so each code leads its own diagnosis
  for (const auto& info : error_catalog()) {
    auto m = first(doctor_text(render_error_json(Error(info.code, "[test] x"), "").dump()));
    EXPECT_EQ(m.at("code"), info.name);
    EXPECT_FALSE(m.at("fixes").empty());
  }
}

// --log-file records the error a command ends with (QA: the file held one info line, so doctor on it
// said "not recognised"): one level-error record with code, message and suggestion, which doctor
// explains; the console shows the error once, as before.
TEST(Doctor, LogFileRecordsTheFatalErrorForDoctor) {
  test::TempDir dir;
  const std::string model = dir.path + "/broken-model", log = dir.path + "/bp.jsonl";
  std::filesystem::create_directories(model);
  std::ofstream(model + "/config.json") << "{ not json";
  std::ofstream(dir.path + "/d.jsonl") << "{\"text\": \"hi\"}\n";
  std::string out;
  const int rc =
      test::run_command("'" + test::backprop_exe() + "' --log-file '" + log + "' train --device cpu --model '" + model +
                            "' --data '" + dir.path + "/d.jsonl' --output '" + dir.path + "/runs'",
                        &out);
  EXPECT_EQ(rc, 2) << out;
  std::istringstream lines(read_file(log));
  nlohmann::json error_record;
  int errors = 0;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    EXPECT_EQ(rec.at("run_id").get<std::string>().size(), 36u) << line;
    if (rec.at("level") == "error") ++errors, error_record = rec;
  }
  ASSERT_EQ(errors, 1) << read_file(log);
  const std::string code = error_record.at("code");
  EXPECT_EQ(code, "DEP_MODEL_LOAD_FAILED") << error_record.dump(2);
  EXPECT_NE(error_record.at("message").get<std::string>().find("broken-model"), std::string::npos);
  EXPECT_FALSE(error_record.at("suggestion").get<std::string>().empty());
  EXPECT_EQ(error_record.at("msg"), "[" + code + "] " + error_record.at("message").get<std::string>());
  size_t shown = 0;
  for (size_t at = out.find("[ERROR] [" + code + "]"); at != std::string::npos;
       at = out.find("[ERROR] [" + code + "]", at + 1))
    ++shown;
  EXPECT_EQ(shown, 1u) << "printed once on the console:\n" << out;
  EXPECT_EQ(out.find("\"level\""), std::string::npos) << out;

  const nlohmann::json report = doctor_json("'" + log + "'");
  EXPECT_EQ(report.at("recognised"), true) << report.dump(2);
  const nlohmann::json& m = first(report);
  EXPECT_EQ(m.at("code"), code);
  EXPECT_FALSE(m.at("fixes").empty());
}

// ---- the data file and its documentation ------------------------------------------------------------------------

TEST(Doctor, DataFileIsWellFormed) {
  auto data = nlohmann::json::parse(read_file(test::source_dir() + "/data/troubleshooting.json"));
  std::set<std::string> seen;
  for (const auto& e : data.at("entries")) {
    std::string id = e.at("id");
    EXPECT_TRUE(seen.insert(id).second) << "duplicate id " << id;
    EXPECT_FALSE(e.at("patterns").empty()) << id;
    EXPECT_GE(e.at("causes").size(), 2u) << id;
    EXPECT_FALSE(e.at("fixes").empty()) << id;
    for (const auto& y : e.value("yield_to", nlohmann::json::array())) EXPECT_NE(y, id);
  }
  for (const auto& e : data.at("entries"))
    for (const auto& y : e.value("yield_to", nlohmann::json::array()))
      EXPECT_TRUE(seen.count(y.get<std::string>())) << "yield_to names unknown entry " << y;
}

TEST(Doctor, TroubleshootingMarkdownIsUpToDate) {
  std::string out;
  ASSERT_EQ(test::run_command("'" + test::backprop_exe() + "' doctor --markdown 2>/dev/null", &out), 0);
  std::string committed = read_file(test::source_dir() + "/docs/troubleshooting.md");
  EXPECT_EQ(out, committed) << "docs/troubleshooting.md is stale: run `backprop doctor --markdown > "
                               "docs/troubleshooting.md`";
  EXPECT_NE(out.find("### Out of memory"), std::string::npos);
  EXPECT_NE(out.find("`RUNTIME_INTERNAL`"), std::string::npos);  // catalog codes are listed too
}

}  // namespace
}  // namespace bp
