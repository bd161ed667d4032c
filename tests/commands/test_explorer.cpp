// The explorer's API in-process (commands/explorer.hpp): what the HTTP tests of tests/explorer/
// cannot reach from outside: a server too busy to take more work, a fused run looked at through
// the weights-keeping form, and the page's data that no prompt can close the <script> holding it.
#include <cstring>
#include <filesystem>

#include "../train/trainer_check.hpp"
#include "commands/explorer.hpp"
#include "train/config.hpp"
#include "train/trainer.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

TEST_CASE("the explorer: a look is relgrad attention's weights; a busy server and a run it lacks say so") {
    TempDir dir("relgrad_test_explorer");
    nlohmann::json c = tiny_run(dir.path / "fused");
    c["model"]["attention"] = "fused";  // keeps no weights: the explorer looks through the bucketed form
    train(Config::parse(c, "tiny"), TrainOptions{});
    const std::string run = (dir.path / "fused").string();
    Explorer explorer({run});
    const nlohmann::json look = explorer.look(0, "4 5 6 7");
    const std::vector<Tensor> weights = attention_weights(run, "4 5 6 7");
    REQUIRE(look["layers"].size() == weights.size());
    CHECK(look["layers"][0]["weights"]["shape"] == Shape{2, 4, 4});
    for (std::size_t layer = 0; layer < weights.size(); ++layer) {  // the bytes of relgrad attention's floats
        const std::vector<uint8_t>& bytes = look["layers"][layer]["weights"]["data"].get_binary();
        const std::vector<double> expected = weights[layer].to_vector();
        REQUIRE(bytes.size() == expected.size() * sizeof(float));
        for (std::size_t i = 0; i < expected.size(); ++i) {
            float shown;
            std::memcpy(&shown, bytes.data() + i * sizeof(float), sizeof(float));
            CHECK(shown == static_cast<float>(expected[i]));
        }
    }
    CHECK(look["tokens"] == nlohmann::json{"4", "5", "6", "7"});
    CHECK_THROWS_WITH_AS(explorer.look(1, "4"), "no run 1: the runs are 0..0", ApiError);

    ExplorerLimits none_waiting;
    none_waiting.max_waiting = 0;
    Explorer busy({run}, none_waiting);
    try {
        busy.look(0, "4 5");
        FAIL("a look past max_waiting was taken");
    } catch (const ApiError& e) {
        CHECK(e.status == 503);
        CHECK(std::string(e.what()) == "busy: 0 model requests are in flight or waiting; try again");
    }
    CHECK(busy.runs().size() == 1);  // what needs no model is answered
    CHECK_THROWS_WITH_AS(
        Explorer({run, (dir.path / "nothing").string()}),
        ((dir.path / "nothing").string() + ": not a trained run (needs config.json and checkpoint/)").c_str(),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(Explorer({}), "explore: name at least one run directory", std::invalid_argument);
}

TEST_CASE("the page's data cannot end its <script> or open a comment, and reads back the same") {
    const nlohmann::json data = {{"prompt", "</script><script>alert(1)</script> <!-- x </SCRIPT"}};
    const std::string page = explorer_page(data);
    const std::string open = "<script id=\"relgrad-data\" type=\"application/json\">";
    const std::size_t start = page.find(open) + open.size(), end = page.find("</script>", start);
    const std::string held = page.substr(start, end - start);
    CHECK(held.find("</") == std::string::npos);
    CHECK(held.find("<!") == std::string::npos);
    CHECK(nlohmann::json::parse(held) == data);
    CHECK(explorer_page(nlohmann::json()).find(open + "null</script>") != std::string::npos);  // server mode
}
