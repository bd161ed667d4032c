#include "train/make_task.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "engine/errors.hpp"
#include "engine/system.hpp"

namespace relgrad {

namespace {

// A text's ids (its text was cut to data.max_length tokens as it was read); an empty encoding (a
// text of spaces only, with words) still needs a position: a single <unk>.
std::vector<int64_t> at_least_one(std::vector<int64_t> ids) {
    if (ids.empty()) ids.push_back(Tokenizer::unk);
    return ids;
}

// ---------------------------------------------------------------- memory

// The parameters of the model config `c` trains, counted on the model built without memory.
int64_t parameter_count(const Config& c, int64_t vocab, int64_t classes) {
    Generator gen(0);
    const Init shapes{gen, DType::float32, /*shapes_only=*/true};
    const TransformerOptions& t = c.model.transformer;
    std::unique_ptr<Module> model;
    if (c.task.kind == TaskKind::language_model || c.task.decoder_only) {
        model = std::make_unique<CausalLanguageModel>(vocab, t, shapes);
    } else if (is_pair_task(c.task.kind)) {
        model = std::make_unique<EncoderDecoder>(vocab, vocab, t, shapes);
    } else {
        model = std::make_unique<SequenceClassifier>(vocab, classes, t, c.model.pooling, shapes);
    }
    int64_t count = 0;
    for (const Tensor& p : model->parameters()) count += p.numel();
    return count;
}

// Refuses a task whose first step needs more memory than this process may have, before its model
// is allocated (a cpu run's: a GPU's memory is the GPU's to refuse), naming what drives it.
void require_memory(const Config& c, const MemoryEstimate& estimate, int64_t vocab) {
    if (c.training.device == Device::cuda) return;
    const MemoryLimit limit = memory_limit();
    const TransformerOptions& t = c.model.transformer;
    RELGRAD_CHECK(estimate.total() <= limit.bytes, "the run does not fit in memory: its first step needs ",
                  estimate.describe(), ", and this process may have ", readable_bytes(limit.bytes), " (", limit.source,
                  "); /model/layers ", t.layers, ", /model/dim ", t.dim, ", /model/ff_dim ", t.ff_dim,
                  ", a vocabulary of ", vocab, " tokens and /training/batch_size ", c.training.batch_size,
                  " drive it: make them smaller");
}

// The task T built from `args`, once the memory estimate of its model (a vocabulary of `vocab`,
// `classes` classes) fits; the task carries it.
template <class T, class... Args>
std::unique_ptr<Task> fitted(const Config& c, int64_t vocab, int64_t classes, Args&&... args) {
    const MemoryEstimate estimate = estimate_memory(c, vocab, classes);
    require_memory(c, estimate, vocab);
    std::unique_ptr<Task> task = std::make_unique<T>(std::forward<Args>(args)...);
    task->memory_estimate = estimate;
    return task;
}

// "data:NAME/FILE" names a file of a fetched data set in the data cache (relgrad data fetch).
std::string resolve_data_path(const std::string& path) {
    if (path.rfind("data:", 0) != 0) return path;
    // NAME/FILE, inside the cache: no absolute path, no "..", nothing empty
    const std::filesystem::path inside(path.substr(5));
    bool within = !inside.empty() && inside.is_relative();
    for (const auto& part : inside) within = within && part != ".." && part != "." && !part.empty();
    RELGRAD_CHECK(within, path, ": expected data:NAME/FILE, a file inside the data cache (", default_data_dir(), ")");
    const std::string resolved = default_data_dir() + "/" + path.substr(5);
    const std::string name = path.substr(5, path.find('/', 5) - 5);
    RELGRAD_CHECK(std::filesystem::exists(resolved), path, ": ", resolved, " does not exist; run 'relgrad data fetch ",
                  name, "' first");
    return resolved;
}

DataConfig with_data_paths_resolved(DataConfig d) {
    d.train = resolve_data_path(d.train);
    if (!d.test.empty()) d.test = resolve_data_path(d.test);
    return d;
}

// The counts a vocabulary is learned from, for the tokenizer the data section asks for.
TokenCounts counts_for(const DataConfig& d) { return TokenCounts(d.tokenizer, {d.lowercase, d.split_punctuation}); }

// The tokenizer the data section asks for, from the counts of the training texts.
Tokenizer tokenizer_for(const DataConfig& d, const TokenCounts& counts) {
    try {
        return Tokenizer::build(counts, d.min_frequency);
    } catch (const std::bad_alloc&) {  // the data's fault, not the model's (make_task's catch below)
        throw std::invalid_argument(d.train + ": not enough memory to build the tokenizer from its texts");
    }
}

// Which of the n examples of data.train are in its training part (the rest held out); a fraction
// that leaves a part empty is an error naming the file and the key.
std::vector<bool> training_part(const DataConfig& d, size_t n, uint64_t seed) {
    try {
        return training_mask(n, d.held_out, seed);
    } catch (const std::invalid_argument& e) {
        std::string why = e.what();
        const std::string function = "split_held_out: ";
        if (why.rfind(function, 0) == 0) why.erase(0, function.size());
        throw std::invalid_argument(d.train + ": /data/held_out: " + why +
                                    " (give more examples, a larger held_out, or data.test)");
    }
}

// Training and test examples from the data section: the test file, or a held-out part of train.
// Every text is cut to data.max_length tokens as its line is read, after `counts` (when given:
// a vocabulary to learn) has counted it whole if it is a training text. So the vocabulary is that
// of the whole training texts, and memory holds one line of a file and what is kept of the texts.
// For a held-out part the file is counted first, to know which examples are the training ones.
template <class T, class Read>
std::pair<std::vector<T>, std::vector<T>> read_split(const DataConfig& d, uint64_t seed, Read read,
                                                     TokenCounts* counts) {
    const TextOptions options{d.lowercase, d.split_punctuation};
    // the examples of `path`; `counting(index)`: whether example `index` is counted
    const auto read_cut = [&](const std::string& path, const std::function<bool(size_t)>& counting) {
        const KeepText keep = [&](size_t index, std::string& text) {
            if (counts && counting(index)) counts->add(text);
            text = first_tokens(d.tokenizer, options, text, d.max_length);
        };
        try {
            return read(path, keep);
        } catch (const std::bad_alloc&) {  // the data's fault, not the model's (make_task's catch below)
            throw std::invalid_argument(path + ": not enough memory to read it");
        }
    };
    if (!d.test.empty()) {
        std::vector<T> train = read_cut(d.train, [](size_t) { return true; });
        return {std::move(train), read_cut(d.test, [](size_t) { return false; })};
    }
    const std::vector<bool> training = training_part(d, count_examples(d.train), seed);
    std::vector<T> examples =
        read_cut(d.train, [&training](size_t index) { return index < training.size() && training[index]; });
    RELGRAD_CHECK_RUNTIME(examples.size() == training.size(), d.train, ": changed while it was read (", training.size(),
                          " examples, then ", examples.size(), ")");
    return split_held_out(std::move(examples), d.held_out, seed);
}

// What errors call the test examples: data.test, or the held-out part of data.train.
std::string test_source(const DataConfig& d) { return d.test.empty() ? d.train + " (its held-out part)" : d.test; }

// data.train_max_tokens, data.test_max_tokens: the examples whose text has at most `limit` tokens
// (all when it is 0); none left is an error that names the key.
template <class T, class Length>
std::vector<T> short_enough(std::vector<T> examples, int64_t limit, const std::string& key, const std::string& file,
                            Length tokens) {
    if (limit == 0) return examples;
    std::vector<T> kept;
    for (T& example : examples)
        if (tokens(example) <= limit) kept.push_back(std::move(example));
    RELGRAD_CHECK(!kept.empty(), "data.", key, " = ", limit, " leaves no example of ", file);
    return kept;
}

std::unique_ptr<Task> make_synthetic_task(const Config& c, const Init& init) {
    const TaskConfig& t = c.task;
    const uint64_t seed = c.training.seed;
    if (t.kind == TaskKind::relative_order) {
        return fitted<ClassificationTask>(c, t.vocab, 2, c.model, t.vocab, 2,
                                          make_relative_order_task(t.train_examples, t.train_lengths[0],
                                                                   t.train_lengths[1], t.vocab, t.distance, seed),
                                          make_relative_order_task(t.test_examples, t.test_lengths[0],
                                                                   t.test_lengths[1], t.vocab, t.distance, seed + 1),
                                          init);
    }
    if (t.kind == TaskKind::symbol_at) {
        return fitted<ClassificationTask>(c, t.vocab, t.vocab - 6, c.model, t.vocab,
                                          t.vocab - 6,  // the symbols 6 .. vocab-1
                                          make_symbol_at_task(t.train_examples, t.train_lengths[0], t.train_lengths[1],
                                                              t.vocab, t.symbol_position, seed),
                                          make_symbol_at_task(t.test_examples, t.test_lengths[0], t.test_lengths[1],
                                                              t.vocab, t.symbol_position, seed + 1),
                                          init);
    }
    auto make = [&t](int64_t count, int64_t min_length, int64_t max_length, int64_t vocab, uint64_t seed) {
        switch (t.kind) {
            case TaskKind::copy: return make_copy_task(count, min_length, max_length, vocab, seed);
            case TaskKind::dedupe: return make_dedupe_task(count, min_length, max_length, vocab, seed);
            case TaskKind::sort: return make_sort_task(count, min_length, max_length, vocab, seed);
            case TaskKind::addition:
                return make_addition_task(count, min_length, max_length, vocab, seed, t.reversed_sum);
            default: return make_reverse_task(count, min_length, max_length, vocab, seed);
        }
    };
    std::vector<TokenPair> train = make(t.train_examples, t.train_lengths[0], t.train_lengths[1], t.vocab, seed),
                           test = make(t.test_examples, t.test_lengths[0], t.test_lengths[1], t.vocab, seed + 1);
    if (t.decoder_only) {
        return fitted<PromptAnswerTask>(c, t.vocab, 0, c.model, t.vocab, std::move(train), std::move(test), init);
    }
    return fitted<SequencePairTask>(c, t.vocab, 0, c.model, t.vocab, std::move(train), std::move(test), init);
}

// classification: labels are the distinct labels of the training data, in sorted order
std::unique_ptr<Task> make_classification_task(const Config& c, const DataConfig& d, const Init& init,
                                               std::optional<Tokenizer>& tokenizer) {
    std::optional<TokenCounts> counts;
    if (!tokenizer) counts = counts_for(d);
    auto [train, test] = read_split<LabeledText>(d, c.training.seed, read_classification, counts ? &*counts : nullptr);
    std::vector<std::string> labels;
    for (const auto& example : train) labels.push_back(example.label);
    std::sort(labels.begin(), labels.end());
    labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
    // one class: nothing to learn, and an accuracy of 1 that means nothing
    RELGRAD_CHECK(labels.size() >= 2, d.train, ": every training example has the label '", labels.front(),
                  "'; classification needs at least two labels");
    if (!tokenizer) tokenizer = tokenizer_for(d, *counts);
    auto encode = [&](const std::vector<LabeledText>& examples, const std::string& where) {
        std::vector<LabeledTokens> out;
        for (const auto& example : examples) {
            const auto found = std::lower_bound(labels.begin(), labels.end(), example.label);
            RELGRAD_CHECK(found != labels.end() && *found == example.label, where, ": label '", example.label,
                          "' does not occur in the training data");
            out.push_back({at_least_one(tokenizer->encode(example.text)), found - labels.begin()});
        }
        return out;
    };
    const auto length = [](const LabeledTokens& e) { return static_cast<int64_t>(e.tokens.size()); };
    std::vector<LabeledTokens> train_examples =
        short_enough(encode(train, d.train), d.train_max_tokens, "train_max_tokens", d.train, length);
    std::vector<LabeledTokens> test_examples = short_enough(
        encode(test, d.test.empty() ? d.train + " (its held-out part; the rest has no such example)" : d.test),
        d.test_max_tokens, "test_max_tokens", test_source(d), length);
    const int64_t vocab = tokenizer->vocab_size(), classes = static_cast<int64_t>(labels.size());
    return fitted<ClassificationTask>(c, vocab, classes, c.model, vocab, classes, std::move(train_examples),
                                      std::move(test_examples), init);
}

std::unique_ptr<Task> make_pairs_task(const Config& c, const DataConfig& d, const Init& init,
                                      std::optional<Tokenizer>& tokenizer) {
    std::optional<TokenCounts> counts;
    if (!tokenizer) counts = counts_for(d);
    auto [train, test] = read_split<TextPair>(d, c.training.seed, read_pairs, counts ? &*counts : nullptr);
    if (!tokenizer) tokenizer = tokenizer_for(d, *counts);
    auto encode = [&](const std::vector<TextPair>& pairs) {
        std::vector<TokenPair> out;
        for (const auto& pair : pairs) {
            out.push_back({at_least_one(tokenizer->encode(pair.source)), at_least_one(tokenizer->encode(pair.target))});
        }
        return out;
    };
    const auto length = [](const TokenPair& pair) { return static_cast<int64_t>(pair.source.size()); };
    std::vector<TokenPair> train_pairs =
        short_enough(encode(train), d.train_max_tokens, "train_max_tokens", d.train, length);
    std::vector<TokenPair> test_pairs =
        short_enough(encode(test), d.test_max_tokens, "test_max_tokens", test_source(d), length);
    if (c.task.decoder_only) {
        return fitted<PromptAnswerTask>(c, tokenizer->vocab_size(), 0, c.model, tokenizer->vocab_size(),
                                        std::move(train_pairs), std::move(test_pairs), init);
    }
    return fitted<SequencePairTask>(c, tokenizer->vocab_size(), 0, c.model, tokenizer->vocab_size(),
                                    std::move(train_pairs), std::move(test_pairs), init);
}

// language_model: one token stream, the last held_out part (or the test file) for evaluation,
// cut into chunks of max_length + 1 tokens that overlap by one (each token is a target once)
std::unique_ptr<Task> make_language_model_task(const Config& c, const DataConfig& d, const Init& init,
                                               std::optional<Tokenizer>& tokenizer) {
    // A text is held whole with its token ids (8 bytes each, a token at most a byte) and their
    // chunks (as many again): one the process has no memory for is refused before it is read.
    const MemoryLimit limit = memory_limit();
    for (const std::string& path : {d.train, d.test}) {
        std::error_code error;  // a missing file: read_text names it
        const double bytes = path.empty() ? 0 : static_cast<double>(std::filesystem::file_size(path, error));
        constexpr double kBytesPerByte = 1 + 8 + 8;
        RELGRAD_CHECK(error || kBytesPerByte * bytes <= limit.bytes, path, ": ", readable_bytes(bytes),
                      " of text need about ", readable_bytes(kBytesPerByte * bytes),
                      " to tokenize (the text, and 16 bytes a token for its ids and their chunks), and this process "
                      "may have ",
                      readable_bytes(limit.bytes), " (", limit.source, "); use a smaller file");
    }
    std::string train_text = read_text(d.train), test_text;
    if (d.test.empty()) {
        const std::size_t cut =
            train_text.size() - static_cast<std::size_t>(d.held_out * static_cast<double>(train_text.size()));
        std::size_t boundary = cut;
        while (boundary < train_text.size() && (static_cast<unsigned char>(train_text[boundary]) & 0xC0) == 0x80)
            ++boundary;
        test_text = train_text.substr(boundary);  // cut at a UTF-8 character boundary
        train_text.resize(boundary);
    } else {
        test_text = read_text(d.test);
    }
    if (!tokenizer) {
        TokenCounts counts = counts_for(d);
        try {
            counts.add(train_text);
        } catch (const std::bad_alloc&) {  // the data's fault, not the model's (make_task's catch below)
            throw std::invalid_argument(d.train + ": not enough memory to count its tokens");
        }
        tokenizer = tokenizer_for(d, counts);
    }
    auto chunks = [&](const std::string& text, const std::string& where) {
        try {
            const std::vector<int64_t> ids = tokenizer->encode(text);
            RELGRAD_CHECK(ids.size() >= 2, where, ": too little text for a language model (under 2 tokens)");
            std::vector<std::vector<int64_t>> out;
            for (std::size_t start = 0; start + 1 < ids.size(); start += d.max_length) {
                const std::size_t end = std::min(ids.size(), start + d.max_length + 1);
                out.emplace_back(ids.begin() + start, ids.begin() + end);
            }
            return out;
        } catch (const std::bad_alloc&) {  // the data's fault, not the model's (make_task's catch below)
            throw std::invalid_argument(where + ": not enough memory to tokenize it");
        }
    };
    return fitted<LanguageModelTask>(c, tokenizer->vocab_size(), 0, c.model, tokenizer->vocab_size(),
                                     chunks(train_text, d.train),
                                     chunks(test_text, d.test.empty() ? d.train + " (held out)" : d.test),
                                     d.tokenizer == Tokenizer::Kind::character, init);
}

}  // namespace

std::string MemoryEstimate::describe() const {
    return "about " + readable_bytes(total()) + " (" + std::to_string(parameters) + " parameters: weights " +
           readable_bytes(weights) + ", gradients " + readable_bytes(gradients) + ", AdamW's moments " +
           readable_bytes(moments) + "; activations " + readable_bytes(activations) + ")";
}

MemoryEstimate estimate_memory(const Config& c, int64_t vocab, int64_t classes) {
    const TransformerOptions& t = c.model.transformer;
    MemoryEstimate e;
    e.parameters = parameter_count(c, vocab, classes);
    const double count = static_cast<double>(e.parameters), sixteen_bit = c.training.precision != DType::float32;
    e.weights = count * (4 + 2 * sixteen_bit);
    e.gradients = 4 * count;
    e.moments = 8 * count;
    // the activations of one shard of a batch of the longest training inputs
    const int64_t shards = c.training.shards.value_or(1);
    const double rows = static_cast<double>((c.training.batch_size + shards - 1) / shards);
    const double length = static_cast<double>(
        longest_input(c.task, reads_files(c.task.kind) ? c.data.max_length : c.task.train_lengths[1]));
    const double d = static_cast<double>(t.dim), f = static_cast<double>(t.ff_dim), h = static_cast<double>(t.heads);
    const double attention = t.impl == AttentionImpl::fused ? 4 * h : 4 * h * length;
    const double per_layer = 16 * d + 4 * f + attention;  // values per token
    // an encoder-decoder's decoder layer adds cross-attention: about half a layer more
    const double layers =
        static_cast<double>(t.layers) * (is_pair_task(c.task.kind) && !c.task.decoder_only ? 2.5 : 1.0);
    const double kept = t.checkpoint ? layers * d + per_layer : layers * per_layer;
    const bool predicts_tokens = c.task.kind == TaskKind::language_model || is_pair_task(c.task.kind);
    const double outputs = predicts_tokens ? 3 * static_cast<double>(vocab) : 0;  // logits, softmax, gradient
    const double value_bytes = sixteen_bit ? 3 : 4;  // 16-bit values, and the float32 ones among them (a mean)
    e.activations = rows * length * (kept + 4 * d + outputs) * value_bytes;
    return e;
}

std::unique_ptr<Task> make_task(const Config& c, const Init& init, std::optional<Tokenizer>& tokenizer) {
    try {
        if (!reads_files(c.task.kind)) return make_synthetic_task(c, init);
        const DataConfig d = with_data_paths_resolved(c.data);
        if (c.task.kind == TaskKind::classification) return make_classification_task(c, d, init, tokenizer);
        if (c.task.kind == TaskKind::pairs) return make_pairs_task(c, d, init, tokenizer);
        return make_language_model_task(c, d, init, tokenizer);
    } catch (const std::bad_alloc&) {  // a model far too big: the sizes that make it, not "std::bad_alloc"
        const TransformerOptions& t = c.model.transformer;
        const int64_t vocab = tokenizer ? tokenizer->vocab_size() : c.task.vocab;
        throw std::invalid_argument("the model does not fit in memory: /model/layers " + std::to_string(t.layers) +
                                    ", /model/dim " + std::to_string(t.dim) + ", /model/ff_dim " +
                                    std::to_string(t.ff_dim) + ", a vocabulary of " + std::to_string(vocab) +
                                    " tokens; make them smaller");
    }
}

}  // namespace relgrad
