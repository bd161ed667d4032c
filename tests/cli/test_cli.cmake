# The command line: `relgrad gradcheck` prints a table and exits 0 when every check passes; bad
# input gets one line on stderr and exit code 2. Run by ctest with -DRELGRAD=<path> and, where the
# test build has the emulated cuda device, -DRELGRAD_EMULATED=<path of relgrad_emulated>; where it
# has the CUDA backend, -DRELGRAD_CUDA_MODULE=<path of librelgrad_cuda.so>.
function(run_relgrad expected_code)
  execute_process(COMMAND ${RELGRAD} ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL expected_code)
    message(FATAL_ERROR "relgrad ${ARGN}: exit code ${code}, expected ${expected_code}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_one_line_error pattern)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines count)
  if(NOT count EQUAL 1 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "expected one stderr line matching '${pattern}', got:\n${err}")
  endif()
endfunction()

set(RELGRAD_PROGRAM ${RELGRAD})
run_relgrad(0 gradcheck --filter matmul)
foreach(expected "op +max abs err +max rel err +pass" "matmul/batched +[0-9.e+-]+ +[0-9.e+-]+ +yes" "7 passed, 0 failed")
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "gradcheck --filter matmul: no line matching '${expected}' in:\n${out}")
  endif()
endforeach()
if(out MATCHES "softmax")
  message(FATAL_ERROR "--filter matmul also ran other ops:\n${out}")
endif()

# every check on the guarded CPU device, whose memory the host may not read
run_relgrad(0 gradcheck --device guarded_cpu)
if(NOT out MATCHES "fused_attention/relative +[0-9.e+-]+ +[0-9.e+-]+ +yes" OR NOT out MATCHES " passed, 0 failed")
  message(FATAL_ERROR "gradcheck --device guarded_cpu:\n${out}")
endif()
# cuda: on a machine without a usable GPU (or a build without CUDA) one line that says why, and
# nothing written; with one, the checks run there
execute_process(COMMAND ${RELGRAD} gradcheck --filter add --device cuda RESULT_VARIABLE code OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(code EQUAL 0)
  if(NOT out MATCHES " passed, 0 failed")
    message(FATAL_ERROR "gradcheck --device cuda:\n${out}")
  endif()
else()
  run_relgrad(2 gradcheck --filter add --device cuda)
  expect_one_line_error("^relgrad: error: no usable CUDA device: [^\n]+")
  if(NOT out STREQUAL "")
    message(FATAL_ERROR "gradcheck --device cuda printed before its error:\n${out}")
  endif()
  if(RELGRAD_CUDA_MODULE AND err MATCHES "librelgrad_cuda|cannot load")
    message(FATAL_ERROR "the CUDA backend's module was not opened: the reason should be CUDA's own:\n${err}")
  endif()
  run_relgrad(2 train --device cuda --out ${CMAKE_CURRENT_BINARY_DIR}/cuda_run)
  expect_one_line_error("^relgrad: error: no usable CUDA device: [^\n]+")
  if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/cuda_run)
    message(FATAL_ERROR "train --device cuda without a GPU wrote ${CMAKE_CURRENT_BINARY_DIR}/cuda_run")
  endif()
endif()
# The CUDA backend is a module opened only for a cuda device: the program links no CUDA library,
# and a missing module is named.
if(RELGRAD_CUDA_MODULE)
  execute_process(COMMAND ldd ${RELGRAD} OUTPUT_VARIABLE libraries RESULT_VARIABLE code)
  if(NOT code EQUAL 0 OR libraries MATCHES "libcu|libnv")
    message(FATAL_ERROR "ldd ${RELGRAD} (exit code ${code}) lists a CUDA library:\n${libraries}")
  endif()
  set(RELGRAD ${CMAKE_COMMAND} -E env RELGRAD_CUDA_LIBRARY=${CMAKE_CURRENT_BINARY_DIR}/missing/librelgrad_cuda.so
      ${RELGRAD_PROGRAM})
  run_relgrad(2 gradcheck --filter add --device cuda)
  expect_one_line_error("^relgrad: error: no usable CUDA device: the CUDA backend librelgrad_cuda.so was not found \\(looked for [^\n]*/missing/librelgrad_cuda.so\\)\n$")
  set(RELGRAD ${RELGRAD_PROGRAM})
endif()
# every check on the test build's cuda device (the CUDA kernels in the emulator)
if(RELGRAD_EMULATED)
  set(RELGRAD ${RELGRAD_EMULATED})
  run_relgrad(0 gradcheck --device cuda)
  if(NOT out MATCHES "attention/relative +[0-9.e+-]+ +[0-9.e+-]+ +yes" OR NOT out MATCHES " passed, 0 failed")
    message(FATAL_ERROR "gradcheck --device cuda (emulated):\n${out}")
  endif()
  set(RELGRAD ${RELGRAD_PROGRAM})
endif()
run_relgrad(2 gradcheck --device tpu)
expect_one_line_error("^relgrad: error: unknown device 'tpu' \\(expected cpu, guarded_cpu or cuda\\)")

run_relgrad(0 gradcheck --filter matmul --threads 1)  # a global option, before or after the command
run_relgrad(2 --threads 0 gradcheck --filter matmul)
expect_one_line_error("^relgrad: --threads: expected a whole number in \\[1, 1024\\], got '0'")
# numbers out of range are errors, never saturated to the largest int64
run_relgrad(2 generate no_such_run --prompt "1 2" --max-tokens 99999999999999999999)
expect_one_line_error("^relgrad: --max-tokens: expected a whole number in \\[1, 65536\\], got '99999999999999999999'")
run_relgrad(2 train --stop-after 0)
expect_one_line_error("^relgrad: --stop-after: expected a whole number in \\[1, 1099511627776\\], got '0'")

run_relgrad(2 gradcheck --filter no_such_op)
expect_one_line_error("^relgrad: error: no registered op is named 'no_such_op'")
run_relgrad(2 gradcheck --filter)
expect_one_line_error("^relgrad: .*--filter")
run_relgrad(2 no_such_command)
expect_one_line_error("^relgrad: error: unknown command 'no_such_command' \\(expected train, validate, eval, generate, attention, explore, data, gradcheck or layer\\)")
# --set and --out on a config whose root is not an object, and text that is not UTF-8
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/array_config.json "[1, 2]")
run_relgrad(2 validate ${CMAKE_CURRENT_BINARY_DIR}/array_config.json --set training.steps=3)
expect_one_line_error("^relgrad: error: --set training.steps=3: the config is not a JSON object")
string(ASCII 255 not_utf8)
run_relgrad(2 train --out ${CMAKE_CURRENT_BINARY_DIR}/bad_out_${not_utf8})
expect_one_line_error("^relgrad: error: --out: not valid UTF-8")
if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/bad_out_${not_utf8})
  message(FATAL_ERROR "--out with invalid UTF-8 left a directory behind")
endif()
run_relgrad(2 --threads 2 no_such_command)
expect_one_line_error("^relgrad: error: unknown command 'no_such_command'")
run_relgrad(2)
expect_one_line_error("^relgrad: ")
run_relgrad(0 --help)

run_relgrad(2 layer --spec /nonexistent/spec.json --in /nonexistent --out /nonexistent/out)
expect_one_line_error("^relgrad: error: /nonexistent/spec.json: missing, expected a layer spec")
run_relgrad(2 layer --in /nonexistent --out /nonexistent/out)
expect_one_line_error("^relgrad: .*--spec")

# configs: validate reports the first bad value with its JSON path; train refuses it the same way
set(work ${CMAKE_CURRENT_BINARY_DIR}/cli_configs)
file(REMOVE_RECURSE ${work})
file(WRITE ${work}/good.json "{\"training\": {\"steps\": 3}}")
file(WRITE ${work}/bad.json "{\"training\": {\"learning_rate\": -1}}")
file(WRITE ${work}/broken.json "{\"training\": ")
# Address-space limits (ulimit -v) are tried only where relgrad starts under one: a sanitizer build
# reserves terabytes of shadow memory at start and cannot (its other tests run all the same)
execute_process(COMMAND sh -c "ulimit -v 2000000; exec \"$0\" --help" ${RELGRAD} RESULT_VARIABLE code
                OUTPUT_QUIET ERROR_QUIET)
set(address_space_limits ${code})
run_relgrad(0 validate ${work}/good.json)
if(NOT out MATCHES "good.json: valid \\(task relative_order, relative positions, 3 steps\\)\nmemory: the first step needs about [0-9.]+ [KM]iB \\([0-9]+ parameters: weights [^;]+; activations [^)]+\\); this process may have [0-9.]+ [MGT]iB \\(")
  message(FATAL_ERROR "validate good.json printed:\n${out}")
endif()
# the memory a run needs is estimated before anything is allocated: more than the process may
# have is refused at once, by validate and train alike, naming the keys (64 layers of width 8192
# need some 800 GiB), and nothing is written
foreach(command validate train)
  run_relgrad(2 ${command} ${work}/good.json --set model.layers=64 --set model.dim=8192 --set model.heads=8
              --set model.ff_dim=32768 --set output.dir=${work}/too_big_run)
  expect_one_line_error("^relgrad: error: the run does not fit in memory: its first step needs about [0-9.]+ [TG]iB \\([0-9]+ parameters: weights [0-9.]+ GiB, gradients [0-9.]+ GiB, AdamW's moments [0-9.]+ GiB; activations [0-9.]+ [MG]iB\\), and this process may have [0-9.]+ [MGT]iB \\((physical memory|the cgroup's memory limit|RLIMIT_AS .*)\\); /model/layers 64, /model/dim 8192, /model/ff_dim 32768, a vocabulary of 16 tokens and /training/batch_size 32 drive it: make them smaller\n$")
  if(EXISTS ${work}/too_big_run)
    message(FATAL_ERROR "${command}: a run refused for its memory still wrote ${work}/too_big_run")
  endif()
endforeach()
if(address_space_limits EQUAL 0)  # 2 GiB the run would need, under a 1.5 GB address space
  execute_process(COMMAND sh -c "ulimit -v 1500000; exec \"$0\" train \"$1\" --set model.layers=8 --set model.dim=1024 --set model.heads=8 --set model.ff_dim=4096 --out \"$2\""
                          ${RELGRAD} ${work}/good.json ${work}/too_big_run RESULT_VARIABLE code ERROR_VARIABLE err)
  expect_one_line_error("^relgrad: error: the run does not fit in memory: its first step needs about 2\\.[0-9] GiB .*, and this process may have [0-9.]+ [MG]iB \\(RLIMIT_AS \\(ulimit -v\\), less what the process maps already\\); /model/layers 8, /model/dim 1024,")
  if(NOT code EQUAL 2 OR EXISTS ${work}/too_big_run)
    message(FATAL_ERROR "a run past ulimit -v: exit code ${code}, or it wrote ${work}/too_big_run")
  endif()
endif()
run_relgrad(2 validate ${work}/bad.json)
expect_one_line_error("^relgrad: error: .*bad.json: /training/learning_rate: got -1, expected a number in \\(0, 10\\]")
run_relgrad(2 validate ${work}/broken.json)
expect_one_line_error("^relgrad: error: .*broken.json: not valid JSON")
run_relgrad(2 validate ${work}/good.json --set model.position=rotary)
expect_one_line_error("/model/position: got \"rotary\"")
run_relgrad(2 train ${work}/bad.json --out ${work}/run)
expect_one_line_error("/training/learning_rate")
if(EXISTS ${work}/run)
  message(FATAL_ERROR "a refused config still wrote ${work}/run")
endif()
run_relgrad(2 train --resume --out ${work}/nothing)
expect_one_line_error("--resume: no run in")

# files that are not what they should be: a directory, a key given twice, a corrupt checkpoint
file(MAKE_DIRECTORY ${work}/a_directory.json)
run_relgrad(2 validate ${work}/a_directory.json)
expect_one_line_error("^relgrad: error: .*a_directory.json: is a directory, expected a config file")
file(WRITE ${work}/twice.json "{\"training\": {\"steps\": 3, \"steps\": 4}}")
run_relgrad(2 validate ${work}/twice.json)
expect_one_line_error("^relgrad: error: .*twice.json: /training/steps: the key is given twice")
run_relgrad(2 layer --spec ${work} --in ${work} --out ${work}/out)
expect_one_line_error("^relgrad: error: .*cli_configs: is a directory, expected a layer spec \\(JSON\\)")
file(WRITE ${work}/spec.json "{\"type\": \"linear\", \"in_features\": 2, \"out_features\": 2}")
file(MAKE_DIRECTORY ${work}/in/x.npy)
run_relgrad(2 layer --spec ${work}/spec.json --in ${work}/in --out ${work}/out)
expect_one_line_error("^relgrad: error: .*in/x.npy: is a directory, expected a .npy file")
# a FIFO, a device or a loop of symbolic links where a file belongs: refused before it is opened
# (opening a FIFO would wait for a writer), whatever reads it
execute_process(COMMAND mkfifo ${work}/pipe.json ${work}/pipe.tsv ${work}/in_pipe.npy RESULT_VARIABLE code)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "mkfifo failed")
endif()
run_relgrad(2 validate ${work}/pipe.json)
expect_one_line_error("^relgrad: error: .*pipe.json: not a regular file \\(a FIFO or a device\\), expected a config file")
file(WRITE ${work}/data.tsv "1\ta b\n0\tb a\n")
run_relgrad(2 train ${work}/good.json --set task.kind=classification --set data.train=${work}/pipe.tsv
            --set data.test=${work}/data.tsv --out ${work}/fifo_run)
expect_one_line_error("^relgrad: error: .*pipe.tsv: not a regular file \\(a FIFO or a device\\), expected a data file")
run_relgrad(2 train ${work}/good.json --set task.kind=classification --set data.train=/dev/zero
            --set data.test=${work}/data.tsv --out ${work}/fifo_run)
expect_one_line_error("^relgrad: error: /dev/zero: not a regular file \\(a FIFO or a device\\), expected a data file")
file(MAKE_DIRECTORY ${work}/in_fifo)
file(RENAME ${work}/in_pipe.npy ${work}/in_fifo/x.npy)
run_relgrad(2 layer --spec ${work}/spec.json --in ${work}/in_fifo --out ${work}/out)
expect_one_line_error("^relgrad: error: .*x.npy: not a regular file \\(a FIFO or a device\\), expected a .npy file")
file(CREATE_LINK ${work}/loop_b.json ${work}/loop_a.json SYMBOLIC)
file(CREATE_LINK ${work}/loop_a.json ${work}/loop_b.json SYMBOLIC)
run_relgrad(2 validate ${work}/loop_a.json)
expect_one_line_error("^relgrad: error: .*loop_a.json: a loop of symbolic links, expected a config file")
if(EXISTS ${work}/fifo_run)
  message(FATAL_ERROR "a refused data file still wrote ${work}/fifo_run")
endif()
# data that cannot train what is asked: one label only; a held-out part too small to hold anything
file(WRITE ${work}/one_label.tsv "1\ta b\n1\tb a\n")
run_relgrad(2 train ${work}/good.json --set task.kind=classification --set data.train=${work}/one_label.tsv
            --set data.test=${work}/data.tsv --out ${work}/one_label_run)
expect_one_line_error("^relgrad: error: .*one_label.tsv: every training example has the label '1'; classification needs at least two labels")
run_relgrad(2 train ${work}/good.json --set task.kind=classification --set data.train=${work}/data.tsv
            --out ${work}/held_out_run)
expect_one_line_error("^relgrad: error: .*data.tsv: /data/held_out: a fraction of 0.1 of 2 examples holds out 0; both the training and the held-out part must be non-empty")
# texts are cut at data.max_length as their lines are read: 100 lines of 1 MB (a file that took
# 1 GB to read whole) train under a 700 MB address-space limit; a data file whose examples do not
# fit (4 million of them) is named as such, not blamed on the model
execute_process(COMMAND /usr/bin/python3 -c
  "line = ' '.join(['word'] * 199999) + '\\n'\nwith open('${work}/big.tsv', 'w') as f:\n    for i in range(100): f.write(str(i % 2) + '\\t' + line)\nwith open('${work}/many.tsv', 'w') as f:\n    f.write(''.join(str(i % 2) + '\\tab\\n' for i in range(4000000)))")
if(address_space_limits EQUAL 0)
  execute_process(COMMAND sh -c "ulimit -v 700000; exec \"$0\" train \"$1\" --set task.kind=classification --set data.train=\"$2\" --set data.test=\"$3\" --set training.batch_size=2 --out \"$4\""
                          ${RELGRAD} ${work}/good.json ${work}/big.tsv ${work}/data.tsv ${work}/big_run
                  RESULT_VARIABLE code ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "100 long lines did not train under 700 MB (exit ${code}):\n${err}")
  endif()
  execute_process(COMMAND sh -c "ulimit -v 400000; exec \"$0\" train \"$1\" --set task.kind=classification --set data.train=\"$2\" --set data.test=\"$3\" --out \"$4\""
                          ${RELGRAD} ${work}/good.json ${work}/many.tsv ${work}/data.tsv ${work}/many_run
                  RESULT_VARIABLE code ERROR_VARIABLE err)
  expect_one_line_error("^relgrad: error: .*many.tsv: not enough memory to read it")
endif()
file(REMOVE ${work}/big.tsv ${work}/many.tsv)
# data:NAME/FILE stays inside the data cache
run_relgrad(2 train ${work}/good.json --set task.kind=classification --set data.train=data:../../etc/passwd
            --set data.test=${work}/data.tsv --out ${work}/escaped_run)
expect_one_line_error("^relgrad: error: data:../../etc/passwd: expected data:NAME/FILE, a file inside the data cache")
# a value given as "" is refused, never taken as one not given (execute_process itself: run_relgrad's
# ARGN would drop an empty argument)
execute_process(COMMAND ${RELGRAD} gradcheck --filter add --device "" RESULT_VARIABLE code ERROR_VARIABLE err)
expect_one_line_error("^relgrad: error: --device: the value is empty")
execute_process(COMMAND ${RELGRAD} train ${work}/good.json --out "" RESULT_VARIABLE code ERROR_VARIABLE err)
expect_one_line_error("^relgrad: error: --out: the value is empty")
# an output path with a file in the way
file(WRITE ${work}/a_file "")
file(MAKE_DIRECTORY ${work}/layer_in)
execute_process(COMMAND /usr/bin/python3 -c
  "import numpy as np; d = '${work}/layer_in/'; np.save(d + 'x.npy', np.ones((256, 2), np.float32)); np.save(d + 'weight.npy', np.eye(2, dtype=np.float32)); np.save(d + 'bias.npy', np.zeros(2, np.float32))")
run_relgrad(2 layer --spec ${work}/spec.json --in ${work}/layer_in --out ${work}/a_file/out)
expect_one_line_error("^relgrad: error: .*a_file/out: cannot create the output directory \\(--out\\) \\(Not a directory\\)")
# output that cannot be written whole leaves no part of a file: y.npy (256 x 2 float32, 2176 bytes)
# past a file size limit of one block (512 or 1024 bytes; SIGXFSZ ignored, so that the write fails)
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 1; exec \"$0\" layer --spec \"$1\" --in \"$2\" --out \"$3\""
                        ${RELGRAD} ${work}/spec.json ${work}/layer_in ${work}/limited
                RESULT_VARIABLE code ERROR_VARIABLE err)
if(NOT code EQUAL 2 OR NOT err MATCHES "limited/y.npy: write failed")
  message(FATAL_ERROR "a write past the file size limit: exit code ${code}, stderr:\n${err}")
endif()
if(EXISTS ${work}/limited/y.npy OR EXISTS ${work}/limited/y.npy.partial)
  message(FATAL_ERROR "a failed write left ${work}/limited/y.npy or its .partial")
endif()
# more threads than the machine can start at once (1024 stacks of 8 MiB under a 2 GB address-space
# limit): one line and exit code 2, not libgomp's own words and exit code 1
if(address_space_limits EQUAL 0)
  execute_process(COMMAND sh -c "ulimit -v 2000000; exec \"$0\" --threads 1024 gradcheck --filter add" ${RELGRAD}
                  RESULT_VARIABLE code ERROR_VARIABLE err)
  expect_one_line_error("^relgrad: error: --threads 1024: this machine could not start 1024 threads at once \\(")
  if(NOT code EQUAL 2)
    message(FATAL_ERROR "--threads 1024 under a memory limit: exit code ${code}")
  endif()
endif()
# what a command prints must reach stdout: a full device is an error
execute_process(COMMAND ${RELGRAD} validate ${work}/good.json OUTPUT_FILE /dev/full RESULT_VARIABLE code
                ERROR_VARIABLE err)
if(NOT code EQUAL 2 OR NOT err MATCHES "^relgrad: error: writing to stdout failed \\(No space left on device\\)")
  message(FATAL_ERROR "validate > /dev/full: exit code ${code}, stderr:\n${err}")
endif()
run_relgrad(0 train ${work}/good.json --out ${work}/trained)
file(WRITE ${work}/trained/checkpoint/state.json "{\"step\": 3, \"extra\": 1}")
file(REMOVE ${work}/trained/summary.json)
run_relgrad(2 train ${work}/good.json --out ${work}/trained --resume)
expect_one_line_error("^relgrad: error: .*state.json: expected {\"step\": a whole number, \"run\": the run's config, \"files\": {\"model\": a fingerprint, \"optimizer\": a fingerprint}, \"seal\": a fingerprint}, got {\"extra\":1,\"step\":3}")
file(RENAME ${work}/trained/checkpoint ${work}/trained/checkpoint.previous)
run_relgrad(0 eval ${work}/trained)  # eval reads a checkpoint left as checkpoint.previous/

# prompts the model cannot read: past its learned positions (here 12: up to 10 tokens, <bos>,
# <eos>), or with [H, L, L] attention weights the process has no memory for
run_relgrad(0 train ${work}/good.json --set model.position=learned --set task.train_lengths=[8,10]
            --set task.test_lengths=[8,10] --out ${work}/learned)
string(REPEAT "5 " 12 prompt)
run_relgrad(0 attention ${work}/learned --prompt "${prompt}" --out ${work}/learned_weights)
run_relgrad(2 attention ${work}/learned --prompt "${prompt} 5" --out ${work}/learned_weights)
expect_one_line_error("^relgrad: error: attention: the prompt has 13 tokens, but the model's learned positions cover 12 \\(the longest input it was trained for\\); give a shorter prompt\n$")
if(address_space_limits EQUAL 0)
  string(REPEAT "5 " 20000 prompt)
  execute_process(COMMAND sh -c "ulimit -v 4000000; exec \"$0\" attention \"$1\" --prompt \"$2\" --out \"$3\""
                          ${RELGRAD} ${work}/trained ${prompt} ${work}/long_weights RESULT_VARIABLE code ERROR_VARIABLE err)
  expect_one_line_error("^relgrad: error: attention: a prompt of 20000 tokens needs attention weights \\[[0-9]+, 20000, 20000\\] of [0-9.]+ GiB in each layer, with their scores [0-9.]+ GiB, and this process may have [0-9.]+ [MG]iB \\(RLIMIT_AS \\(ulimit -v\\), less what the process maps already\\); give a shorter prompt \\(generate with model.attention = fused keeps no \\[L, L\\] tensor\\)\n$")
  if(NOT code EQUAL 2 OR EXISTS ${work}/long_weights)
    message(FATAL_ERROR "attention with a 20000-token prompt under 4 GB: exit code ${code}, or it wrote weights")
  endif()
endif()

# paths the system refuses, in one line naming the path and the system's reason
file(CREATE_LINK loop ${work}/loop SYMBOLIC)
run_relgrad(2 eval ${work}/loop)
expect_one_line_error("^relgrad: error: [^ ]*/loop[^ ]*: Too many levels of symbolic links\n$")
run_relgrad(2 train ${work}/good.json --out ${work}/loop/run)
expect_one_line_error("^relgrad: error: [^ ]*/loop[^ ]*: .*Too many levels of symbolic links\\)?\n$")
string(REPEAT "a" 300 long_name)
run_relgrad(2 eval ${work}/${long_name})
expect_one_line_error("^relgrad: error: [^ ]*/aaaa[^ ]*: File name too long\n$")
if(address_space_limits EQUAL 0)  # a 300 MB text, held with its ids and chunks, past 4 GB: refused unread
  execute_process(COMMAND truncate -s 300M ${work}/big.txt RESULT_VARIABLE code)
  execute_process(COMMAND sh -c "ulimit -v 4000000; exec \"$0\" train \"$1\" --set task.kind=language_model --set data.train=\"$2\" --out \"$3\""
                          ${RELGRAD} ${work}/good.json ${work}/big.txt ${work}/big_text_run
                  RESULT_VARIABLE code ERROR_VARIABLE err)
  expect_one_line_error("^relgrad: error: [^ ]*/big.txt: 300.0 MiB of text need about [0-9.]+ GiB to tokenize \\(the text, and 16 bytes a token for its ids and their chunks\\), and this process may have [0-9.]+ [MG]iB \\(RLIMIT_AS .*\\); use a smaller file\n$")
  file(REMOVE ${work}/big.txt)
endif()
if(EXISTS /proc/self/mem)  # a regular file whose read fails (EIO)
  run_relgrad(2 train ${work}/good.json --set task.kind=\"language_model\" --set data.train=\"/proc/self/mem\"
              --out ${work}/mem_run)
  expect_one_line_error("^relgrad: error: /proc/self/mem: read failed \\(Input/output error\\), expected a data file\n$")
endif()

run_relgrad(2 eval ${work}/no_run)
expect_one_line_error("no_run: not a trained run")
run_relgrad(2 generate ${work}/no_run --prompt hello)
expect_one_line_error("no_run: not a trained run")
run_relgrad(2 data fetch imagenet --dir ${work}/data)
expect_one_line_error("imagenet")

# --profile: a table of the steps after the first; a run whose only step is the untimed first one
# says so rather than printing nothing
run_relgrad(0 train --set training.steps=1 --profile --out ${work}/profiled_one)
if(NOT out MATCHES "profile: no step to show: only the first step this process ran")
  message(FATAL_ERROR "train --profile with one step printed:\n${out}")
endif()
run_relgrad(0 train --set training.steps=2 --profile --out ${work}/profiled_two)
if(NOT out MATCHES "profile of the training steps after the first" OR out MATCHES "no step to show")
  message(FATAL_ERROR "train --profile with two steps printed:\n${out}")
endif()
run_relgrad(0 train --set training.steps=1 --out ${work}/one_step)
if(out MATCHES "profile( of|:)")
  message(FATAL_ERROR "train without --profile printed a profile line:\n${out}")
endif()
