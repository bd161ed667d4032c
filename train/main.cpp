// relgrad: the command-line program.
//
//   relgrad gradcheck [--filter OP]                 run the registered gradient checks, print a table
//   relgrad layer --spec SPEC --in DIR --out DIR    one layer forward and backward on .npy files
//
// Exit codes: 0 success, 1 a check failed, 2 bad input (one line on stderr).
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/op_checks.hpp"
#include "train/layer_command.hpp"

namespace {

int run_gradcheck(const std::string& filter) {
    const std::vector<relgrad::OpCheck> checks = relgrad::op_checks_for(filter);
    if (checks.empty()) throw std::invalid_argument("no registered op is named '" + filter + "'");
    std::printf("%-32s %12s %12s  %s\n", "op", "max abs err", "max rel err", "pass");
    int failed = 0;
    std::string reports;
    for (const relgrad::OpCheck& check : checks) {
        const relgrad::GradcheckResult result = check.run();
        std::printf("%-32s %12.3e %12.3e  %s\n", check.name.c_str(), result.max_abs_error, result.max_rel_error,
                    result.passed ? "yes" : "NO");
        if (!result.passed) {
            ++failed;
            reports += "\n" + check.name + ": " + result.report;
        }
    }
    std::printf("%s\n%zu passed, %d failed\n", reports.c_str(), checks.size() - failed, failed);
    return failed == 0 ? 0 : 1;
}

std::string one_line(std::string message) {
    for (char& c : message) {
        if (c == '\n') c = ' ';
    }
    return message;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"relgrad: a reverse-mode autograd engine and relative-position Transformer layers"};
    app.require_subcommand(1);
    std::string filter;
    CLI::App* gradcheck = app.add_subcommand("gradcheck", "run the gradient check of every registered op");
    gradcheck->add_option("--filter", filter, "run only the cases of this op (e.g. matmul)");
    std::string spec, in_dir, out_dir;
    CLI::App* layer = app.add_subcommand("layer", "run one layer forward and backward on .npy files");
    layer->add_option("--spec", spec, "the layer as JSON: type and options")->required();
    layer->add_option("--in", in_dir, "directory with x.npy, one <parameter>.npy each, optional mask.npy, dy.npy")
        ->required();
    layer->add_option("--out", out_dir, "directory for y.npy, dx.npy and grad.<parameter>.npy")->required();
    try {
        app.parse(argc, argv);
        if (gradcheck->parsed()) return run_gradcheck(filter);
        if (layer->parsed()) relgrad::run_layer_command(spec, in_dir, out_dir);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        std::cerr << "relgrad: " << one_line(e.what()) << " (run 'relgrad --help')\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "relgrad: error: " << one_line(e.what()) << "\n";
        return 2;
    }
    return 0;
}
