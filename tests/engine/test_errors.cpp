// engine/errors.hpp: each macro throws its own exception type with the parts as the message, and
// evaluates the parts only when its condition is false.
// (No differentiable code here, so no gradcheck.)
#include "engine/errors.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <typeindex>

namespace {

// What a call threw: the exception's exact type (a std::invalid_argument is also a
// std::logic_error, so catching by base class would not tell the macros apart) and its message.
struct Thrown {
    std::type_index type = typeid(void);
    std::string message;
};

template <class Call>
Thrown thrown_by(Call call) {
    try {
        call();
    } catch (const std::exception& e) {
        return {typeid(e), e.what()};
    }
    return {};  // nothing thrown: type stays void
}

// A part of a message that counts how often it is evaluated.
int evaluations = 0;
std::string counted(const std::string& text) {
    ++evaluations;
    return text;
}

}  // namespace

TEST_CASE("RELGRAD_CHECK throws std::invalid_argument with the parts written one after the other") {
    const Thrown thrown = thrown_by([] { RELGRAD_CHECK(2 < 1, "slice: step must be positive, got ", -3, " of ", 7u); });
    CHECK(thrown.type == std::type_index(typeid(std::invalid_argument)));
    CHECK(thrown.message == "slice: step must be positive, got -3 of 7");
}

TEST_CASE("a double in a message is written as operator<< writes it, or with six decimals through std::to_string") {
    const double lr = 1e-5;
    CHECK(thrown_by([&] { RELGRAD_CHECK(false, "lr ", lr); }).message == "lr 1e-05");
    CHECK(thrown_by([&] { RELGRAD_CHECK(false, "lr ", std::to_string(lr)); }).message == "lr 0.000010");
}

TEST_CASE("RELGRAD_CHECK_RUNTIME throws std::runtime_error with the parts as the message") {
    const Thrown thrown = thrown_by([] { RELGRAD_CHECK_RUNTIME(false, "data.tsv", ": cannot open, ", 2, " tries"); });
    CHECK(thrown.type == std::type_index(typeid(std::runtime_error)));
    CHECK(thrown.message == "data.tsv: cannot open, 2 tries");
}

TEST_CASE("RELGRAD_INTERNAL_ASSERT throws std::logic_error that says it is relgrad's own error") {
    const Thrown thrown = thrown_by([] { RELGRAD_INTERNAL_ASSERT(false, "unknown dtype ", 9); });
    CHECK(thrown.type == std::type_index(typeid(std::logic_error)));
    CHECK(thrown.message == "relgrad internal error: unknown dtype 9");
}

TEST_CASE("a check that holds throws nothing and does not evaluate its parts") {
    evaluations = 0;
    CHECK(thrown_by([] { RELGRAD_CHECK(1 < 2, counted("a")); }).type == std::type_index(typeid(void)));
    CHECK(thrown_by([] { RELGRAD_CHECK_RUNTIME(true, counted("b")); }).type == std::type_index(typeid(void)));
    CHECK(thrown_by([] { RELGRAD_INTERNAL_ASSERT(true, counted("c")); }).type == std::type_index(typeid(void)));
    CHECK(evaluations == 0);
}

TEST_CASE("a check that fails evaluates its condition and each part once") {
    evaluations = 0;
    int conditions = 0;
    const Thrown thrown = thrown_by([&] { RELGRAD_CHECK(++conditions > 5, counted("x"), counted("y")); });
    CHECK(thrown.message == "xy");
    CHECK(conditions == 1);
    CHECK(evaluations == 2);
}
