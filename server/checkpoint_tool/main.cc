// summa-checkpoint: parses its command line and calls server/checkpoint_tool/checkpoint_tool.h.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "server/checkpoint_tool/checkpoint_tool.h"

namespace {

constexpr char kUsage[] =
    "usage: summa-checkpoint show [--tensors] CKPT\n"
    "       summa-checkpoint export CKPT OUT.safetensors\n"
    "\n"
    "Reads Summa's checkpoints without a server.\n"
    "\n"
    "  show     prints CKPT's header: the job (workers, mode, optimizer and its state, partition\n"
    "           bytes), the version (steps completed), when it was written, which shard of how\n"
    "           many wrote it, the group, and the model's tensors (their count and parameters;\n"
    "           with --tensors, each name and shape). It reads the whole file to check it, then\n"
    "           lists the embedding tables: name, dim, optimizer, rows, version.\n"
    "  export   prints CKPT's header, then writes its master weights to OUT as a safetensors file\n"
    "           (float32, the model's tensor names and shapes in its order, __metadata__ with\n"
    "           format pt and the job: summa.step, summa.mode, summa.world_size, summa.optimizer,\n"
    "           ...). OUT appears whole or not at all. Load it in PyTorch with\n"
    "           summa.load_safetensors(module, OUT), or start a job from it with\n"
    "           summa-server --init_from=OUT. Embedding tables are not exported.\n"
    "\n"
    "CKPT is a checkpoint file (ckpt-<version>.summa) or a job's checkpoint directory\n"
    "(summa-server --checkpoint_dir): its newest whole checkpoint, torn files skipped. For a job\n"
    "that ran on K server shards (the directory holds shard-I-of-K/), every shard's checkpoint of\n"
    "the newest version all K keep is read and the whole model assembled; one shard's file alone\n"
    "holds only its partitions and is refused by export.\n"
    "\n"
    "Exit status: 0 done, 1 failed (the message says why), 2 usage.\n";

int Usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "summa-checkpoint: %s\n\n", why);
  std::fputs(kUsage, stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h" || a == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (args.empty()) return Usage("no command");
  const std::string command = args[0];
  args.erase(args.begin());
  bool tensors = false;
  std::vector<std::string> operands;
  for (const std::string& a : args) {
    if (a == "--tensors" && command == "show") {
      tensors = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage(("unknown option " + a).c_str());
    } else {
      operands.push_back(a);
    }
  }
  absl::Status done;
  if (command == "show") {
    if (operands.size() != 1) return Usage("show takes one CKPT");
    done = summa::server::ShowCheckpoint(operands[0], tensors, std::cout);
  } else if (command == "export") {
    if (operands.size() != 2) return Usage("export takes CKPT and OUT");
    done = summa::server::ExportCheckpoint(operands[0], operands[1], std::cout);
  } else {
    return Usage(("unknown command " + command).c_str());
  }
  std::cout.flush();
  if (!done.ok()) {
    std::fprintf(stderr, "summa-checkpoint: %s\n", std::string(done.message()).c_str());
    return 1;
  }
  return 0;
}
