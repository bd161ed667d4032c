// relgrad explorer: the page's behaviour (docs/explorer.md). Every number it shows comes from the
// API (or, in an exported file, from the same answers stored in the page); nothing is re-derived
// here. Charts are plain SVG, so that each one exports as SVG and, drawn on a canvas, as PNG.
// One file: the page's one script, embedded in the program beside page.html and style.css.
'use strict';

// ---------------------------------------------------------------- where the data comes from

// Arrays arrive as {dtype, shape, data: base64 of little-endian values}: back to a typed array.
function unpack(array) {
    if (!array) return null;
    const bytes = Uint8Array.from(atob(array.data), (c) => c.charCodeAt(0));
    const Type = {float32: Float32Array, float64: Float64Array, uint8: Uint8Array}[array.dtype];
    return {shape: array.shape, values: new Type(bytes.buffer)};
}

// The server's API: GET /api/runs, /api/runs/ID/metrics, /api/runs/ID/parameters; POST
// /api/runs/ID/attention {"prompt": TEXT}. An error answers {"error": message}.
function serverSource() {
    async function ask(path, body) {
        const response = await fetch(
            path,
            body === undefined ?
                {} :
                {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
        const answer = await response.json();
        if (!response.ok) throw new Error(answer.error || 'HTTP ' + response.status);
        return answer;
    }
    return {
        description: 'served by relgrad explore',
        prompts: null,  // any prompt may be typed
        runs: () => ask('api/runs'),
        metrics: (id) => ask('api/runs/' + id + '/metrics'),
        parameters: (id) => ask('api/runs/' + id + '/parameters'),
        look: (id, prompt) => ask('api/runs/' + id + '/attention', {prompt: prompt}),
    };
}

// An exported page: the same answers, stored for the prompts it was made with.
function storedSource(data) {
    const prompts = data.looks[Object.keys(data.looks)[0]].map((look) => look.prompt);
    return {
        description: 'exported view (no server)',
        prompts: prompts,
        runs: async () => data.runs,
        metrics: async (id) => data.metrics[id],
        parameters: async (id) => data.parameters[id],
        look: async (id, prompt) => {
            const look = data.looks[id].find((l) => l.prompt === prompt);
            if (!look) throw new Error('this exported view holds only the prompts it was made with');
            return look;
        },
    };
}

// ---------------------------------------------------------------- SVG charts

const SVG = 'http://www.w3.org/2000/svg';
function svgElement(tag, attributes, parent) {
    const element = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, value);
    if (parent) parent.appendChild(element);
    return element;
}
function element(tag, attributes, text) {
    const e = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) e.setAttribute(name, value);
    if (text !== undefined) e.textContent = text;
    return e;
}
function format(value) {
    if (!Number.isFinite(value)) return String(value);
    const size = Math.abs(value);
    const rounded = Number(value.toPrecision(4));  // four significant digits, trailing zeros dropped
    return size !== 0 && (size < 1e-3 || size >= 1e5) ? rounded.toExponential() : String(rounded);
}

// A chart in a <figure> with its title and two export buttons; `name` names the files.
function figure(title, svg, name) {
    const box = element('figure', {'data-chart': name});
    const caption = element('figcaption');
    caption.appendChild(element('span', {}, title));
    const buttons = element('span');
    for (const kind of ['png', 'svg']) {
        const button = element('button', {type: 'button', 'data-export': kind}, kind.toUpperCase());
        button.addEventListener('click', () => exportChart(svg, name, kind));
        buttons.appendChild(button);
    }
    caption.appendChild(buttons);
    box.appendChild(caption);
    box.appendChild(svg);
    return box;
}

function download(blob, filename) {
    const link = element('a', {href: URL.createObjectURL(blob), download: filename});
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

// SVG: the chart's markup as it is; PNG: that SVG drawn on a canvas at twice its size.
function exportChart(svg, name, kind) {
    const markup = new XMLSerializer().serializeToString(svg);
    const blob = new Blob([markup], {type: 'image/svg+xml'});
    if (kind === 'svg') return download(blob, name + '.svg');
    const image = new Image();
    image.onload = () => {
        const canvas =
            element('canvas', {width: svg.getAttribute('width') * 2, height: svg.getAttribute('height') * 2});
        const context = canvas.getContext('2d');
        context.fillStyle = '#fff';
        context.fillRect(0, 0, canvas.width, canvas.height);
        context.drawImage(image, 0, 0, canvas.width, canvas.height);
        canvas.toBlob((png) => download(png, name + '.png'), 'image/png');
    };
    image.src = 'data:image/svg+xml;base64,' + btoa(unescape(encodeURIComponent(markup)));
}

// Colours: weights from white to blue; signed values from blue through white to red, both
// ends at +-range (the same range for charts shown side by side).
function sequentialColour(v, range) {
    const t = range > 0 ? Math.min(Math.max(v / range, 0), 1) : 0;
    return 'rgb(' + Math.round(255 - 222 * t) + ',' + Math.round(255 - 170 * t) + ',' + Math.round(255 - 75 * t) + ')';
}
function divergingColour(v, range) {
    const t = range > 0 ? Math.min(Math.max(v / range, -1), 1) : 0;
    if (t >= 0) return 'rgb(255,' + Math.round(255 - 180 * t) + ',' + Math.round(255 - 200 * t) + ')';
    return 'rgb(' + Math.round(255 + 200 * t) + ',' + Math.round(255 + 140 * t) + ',255)';
}

// A heatmap of rows x columns cells: value(i, j), null for a masked cell. `hover(i, j)` gives the
// tooltip's lines and data attributes; one listener on the chart finds the cell under the mouse.
function heatmap({rows, columns, rowLabels, columnLabels, value, colour, range, hover, legend}) {
    const cell = Math.max(3, Math.min(40, Math.floor(480 / Math.max(rows, columns))));
    const left = 60, top = 54, width = Math.max(left + cell * columns + 10, 330), height = top + cell * rows + 40;
    const svg = svgElement('svg', {xmlns: SVG, width: width, height: height, viewBox: '0 0 ' + width + ' ' + height});
    svgElement('rect', {width: width, height: height, fill: '#fff'}, svg);
    const grid = svgElement('g', {class: 'cells', transform: 'translate(' + left + ',' + top + ')'}, svg);
    for (let i = 0; i < rows; ++i) {
        for (let j = 0; j < columns; ++j) {
            const v = value(i, j);
            svgElement(
                'rect',
                {x: j * cell, y: i * cell, width: cell, height: cell, fill: v === null ? '#d9d9d9' : colour(v, range)},
                grid);
        }
    }
    const labelEvery = Math.ceil(12 / cell);
    for (let i = 0; i < rows; i += labelEvery) {
        svgElement('text', {x: left - 4, y: top + (i + 0.7) * cell, 'text-anchor': 'end', 'font-size': 10}, svg)
            .textContent = rowLabels[i];
    }
    for (let j = 0; j < columns; j += labelEvery) {
        const x = left + (j + 0.5) * cell;
        svgElement(
            'text', {x: x, y: top - 4, 'font-size': 10, transform: 'rotate(-60 ' + x + ' ' + (top - 4) + ')'}, svg)
            .textContent = columnLabels[j];
    }
    svgElement('text', {x: left, y: height - 22, 'font-size': 11}, svg).textContent = legend;
    // the colour scale's two ends (and the middle of a signed one)
    const bar = svgElement('g', {class: 'scale', transform: 'translate(' + left + ',' + (height - 14) + ')'}, svg);
    const signed = colour === divergingColour;
    for (let s = 0; s < 40; ++s) {
        const v = signed ? range * (2 * s / 39 - 1) : range * s / 39;
        svgElement('rect', {x: s * 4, y: 0, width: 4, height: 8, fill: colour(v, range)}, bar);
    }
    svgElement('text', {x: 166, y: 8, 'font-size': 10}, bar).textContent =
        (signed ? format(-range) + ' .. ' : '0 .. ') + format(range);
    if (hover) {
        grid.addEventListener('mousemove', (event) => {
            const box = grid.getBoundingClientRect();
            const j = Math.floor((event.clientX - box.left) / cell), i = Math.floor((event.clientY - box.top) / cell);
            if (i < 0 || j < 0 || i >= rows || j >= columns) return hideTooltip();
            showTooltip(event, hover(i, j));
        });
        grid.addEventListener('mouseleave', hideTooltip);
    }
    return svg;
}

// A line chart: series [{name, points: [[x, y], ...]}], a log y axis when asked.
function lineChart({series, xLabel, yLabel, logY}) {
    const width = 450, height = 260, left = 66, right = 110, top = 12, bottom = 36;
    const svg = svgElement('svg', {xmlns: SVG, width: width, height: height, viewBox: '0 0 ' + width + ' ' + height});
    svgElement('rect', {width: width, height: height, fill: '#fff'}, svg);
    const points = series.flatMap((s) => s.points).filter(([, y]) => Number.isFinite(y) && (!logY || y > 0));
    if (points.length === 0) {
        svgElement('text', {x: 20, y: 40, 'font-size': 12}, svg).textContent = 'nothing to show';
        return svg;
    }
    const ty = (y) => (logY ? Math.log10(y) : y);
    let [x0, x1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...points.map((p) => ty(p[1]))), Math.max(...points.map((p) => ty(p[1])))];
    if (x0 === x1) {
        x0 -= 1;
        x1 += 1;
    }
    if (y0 === y1) {
        y0 -= 0.5;
        y1 += 0.5;
    }
    const px = (x) => left + (x - x0) / (x1 - x0) * (width - left - right);
    const py = (y) => top + (1 - (ty(y) - y0) / (y1 - y0)) * (height - top - bottom);
    const axes = svgElement('g', {stroke: '#999', fill: 'none'}, svg);
    svgElement('path', {d: 'M' + left + ',' + top + 'V' + (height - bottom) + 'H' + (width - right)}, axes);
    // ticks at round numbers: 1, 2 or 5 times a power of ten apart (on a log axis, at powers of ten)
    for (const xt of roundTicks(x0, x1)) {
        svgElement('text', {x: px(xt), y: height - bottom + 13, 'text-anchor': 'middle', 'font-size': 10}, svg)
            .textContent = format(xt);
    }
    const yTicks = logY ? roundTicks(y0, y1, true).map((e) => 10 ** e) : roundTicks(y0, y1);
    for (const yt of yTicks) {
        svgElement('text', {x: left - 4, y: py(yt) + 3, 'text-anchor': 'end', 'font-size': 10}, svg).textContent =
            format(yt);
    }
    svgElement('text', {x: (left + width - right) / 2, y: height - 4, 'text-anchor': 'middle', 'font-size': 11}, svg)
        .textContent = xLabel;
    svgElement(
        'text', {
            x: 12,
            y: height / 2,
            'font-size': 11,
            transform: 'rotate(-90 12 ' + height / 2 + ')',
            'text-anchor': 'middle'
        },
        svg)
        .textContent = yLabel;
    series.forEach((s, n) => {
        const colour = palette[n % palette.length];
        const shown = s.points.filter(([, y]) => Number.isFinite(y) && (!logY || y > 0));
        if (shown.length === 0) return;
        svgElement(
            'path', {
                d: shown.map(([x, y], k) => (k ? 'L' : 'M') + px(x) + ',' + py(y)).join(''),
                stroke: colour,
                fill: 'none',
                'stroke-width': 1.5
            },
            svg);
        if (shown.length < 40) {
            for (const [x, y] of shown) svgElement('circle', {cx: px(x), cy: py(y), r: 2.5, fill: colour}, svg);
        }
        svgElement('text', {x: width - right + 6, y: top + 10 + 14 * n, fill: colour, 'font-size': 11}, svg)
            .textContent = s.name;
    });
    return svg;
}
// About five round values between lo and hi: multiples of 1, 2 or 5 times a power of ten (whole
// powers only, when `whole`).
function roundTicks(lo, hi, whole) {
    const raw = (hi - lo) / 5, power = 10 ** Math.floor(Math.log10(raw));
    const step = whole ? Math.max(1, Math.round(raw)) : [1, 2, 5, 10].map((m) => m * power).find((v) => v >= raw);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return ticks;
}
const palette = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];

const tooltip = document.getElementById('tooltip');
function showTooltip(event, {lines, data}) {
    tooltip.textContent = lines.join('\n');
    for (const attribute of [...tooltip.attributes]) {
        if (attribute.name.startsWith('data-')) tooltip.removeAttribute(attribute.name);
    }
    for (const [name, value] of Object.entries(data)) tooltip.setAttribute('data-' + name, value);
    tooltip.hidden = false;
    tooltip.style.left = event.clientX + 14 + 'px';
    tooltip.style.top = event.clientY + 14 + 'px';
}
function hideTooltip() { tooltip.hidden = true; }

// ---------------------------------------------------------------- the page's state and views

const state = {
    source: null,
    runs: [],
    looks: {},
    parameters: {},
    prompt: null,
    asked: 0,  // looks asked for so far: only the latest one's answers are drawn
};
const $ = (id) => document.getElementById(id);

function showError(error) { $('error').textContent = error ? String(error.message || error) : ''; }

function fillSelect(select, options, keep) {
    const previous = select.value;
    select.replaceChildren(...options.map(([value, label]) => element('option', {value: value}, label)));
    if (keep && options.some(([value]) => String(value) === previous)) select.value = previous;
}

function runsTable() {
    const table = $('runs');
    table.replaceChildren();
    const head = element('tr');
    for (const name of ['run', 'task', 'position', 'precision', 'parameters', 'steps', 'final metric']) {
        head.appendChild(element('th', {}, name));
    }
    table.appendChild(head);
    for (const run of state.runs) {
        const row = element('tr', {'data-run': run.id});
        const final = run.summary && run.summary.final ? run.summary.final[run.metric] : undefined;
        const cells = [
            run.name, run.task, run.position, run.precision, run.parameters.toLocaleString('en'),
            run.summary ? run.summary.steps : '(unfinished)',
            final === undefined ? '' : run.metric + ' ' + format(final)
        ];
        cells.forEach((text, k) => row.appendChild(element('td', k === 4 ? {class: 'number'} : {}, String(text))));
        table.appendChild(row);
    }
    // each run's config and summary, as written in its directory
    const files = $('run-files');
    files.replaceChildren();
    for (const run of state.runs) {
        const details = element('details', {'data-run': run.id});
        details.appendChild(element('summary', {}, run.name + ': config.json and summary.json (' + run.dir + ')'));
        details.appendChild(element('pre', {}, JSON.stringify({config: run.config, summary: run.summary}, null, 1)));
        files.appendChild(details);
    }
}

// Training curves of every run: loss, learning rate, the loss scale (float16), the headline metric
// at each evaluation, and the metric by length at the last evaluation.
function trainingCharts(metrics) {
    const box = $('training');
    box.replaceChildren();
    const train = (id) => metrics[id].filter((line) => !('eval' in line));
    const evals = (id) => metrics[id].filter((line) => 'eval' in line);
    const perRun = (pick) => state.runs.map((run) => ({name: run.name, points: pick(run)}));
    const trainSeries = (key) => perRun((run) => train(run.id).filter((l) => key in l).map((l) => [l.step, l[key]]));
    box.appendChild(figure('loss', lineChart({series: trainSeries('loss'), xLabel: 'step', yLabel: 'loss'}), 'loss'));
    box.appendChild(figure(
        'learning rate', lineChart({series: trainSeries('learning_rate'), xLabel: 'step', yLabel: 'learning rate'}),
        'learning_rate'));
    if (state.runs.some((run) => train(run.id).some((l) => 'loss_scale' in l))) {
        box.appendChild(figure(
            'loss scale (float16)',
            lineChart({series: trainSeries('loss_scale'), xLabel: 'step', yLabel: 'loss scale', logY: true}),
            'loss_scale'));
    }
    const metricSeries = perRun((run) => evals(run.id).map((l) => [l.step, l.eval[run.metric]]));
    const metricNames = [...new Set(state.runs.map((run) => run.metric))].join(' / ');
    box.appendChild(figure(
        'test ' + metricNames, lineChart({series: metricSeries, xLabel: 'step', yLabel: metricNames}), 'test_metric'));
    // by length: the buckets' names ("1-8", "9-16", ">48") in order of their first length
    const bucketStart = (name) => Number(name.replace('>', '').split('-')[0]) + (name[0] === '>' ? 1 : 0);
    const byLength = perRun((run) => {
        const last = evals(run.id).pop();
        if (!last || !last.eval.by_length) return [];
        return Object.entries(last.eval.by_length)
            .map(([bucket, result]) => [bucketStart(bucket), result[run.metric]])
            .filter(([, y]) => y !== undefined)
            .sort((a, b) => a[0] - b[0]);
    });
    box.appendChild(figure(
        'test ' + metricNames + ' by length (last evaluation)',
        lineChart({series: byLength, xLabel: 'length (first of its bucket)', yLabel: metricNames}), 'by_length'));
}

// What the position part of a score is, in each scheme's terms.
const positionPart = {
    relative: 'Shaw\'s q_i . a^K_ij / sqrt(Dh)',
    gated: 'gated: g q_i . a^K_ij + (1 - g) absolute, / sqrt(Dh)',
    rope: 'RoPE: rotated score - unrotated q_i . k_j',
    alibi: 'ALiBi: -m_h |i - j|',
    t5: 'T5: the bucket\'s bias',
};

function layerAndHeadChoices() {
    const looks = selectedRuns().map((id) => state.looks[id]).filter(Boolean);
    if (looks.length === 0) return;
    const layers = Math.max(...looks.map((look) => look.layers.length));
    const heads = Math.max(...looks.map((look) => unpack(look.layers[0].weights).shape[0]));
    fillSelect($('layer'), [...Array(layers).keys()].map((l) => [l, 'layer ' + l]), true);
    fillSelect($('head'), [...Array(heads).keys()].map((h) => [h, 'head ' + h]), true);
}

function selectedRuns() {
    const runs = [Number($('run-a').value)];
    if ($('run-b').value !== '') runs.push(Number($('run-b').value));
    return runs;
}

// The heatmaps of the chosen layer, head and view for run A (and run B beside it, on one scale).
function drawHeatmaps() {
    const box = $('heatmaps');
    box.replaceChildren();
    const answers = $('answers');
    answers.replaceChildren();
    const layer = Number($('layer').value), head = Number($('head').value), view = $('view').value;
    const shown = [];
    for (const id of selectedRuns()) {
        const look = state.looks[id];
        const run = state.runs[id];
        if (!look) continue;
        const answer = look.answer;
        const text = answer.error ?
            'no ' + answer.kind + ': ' + answer.error :
            answer.kind === 'class' ?
            'class ' + answer.class + ' (p = ' + format(answer.probabilities[answer.class]) + ')' :
            answer.kind + ': ' + answer.text;
        answers.appendChild(element('p', {class: 'answer', 'data-run': id}, run.name + ' answers ' + text));
        if (layer >= look.layers.length) {
            box.appendChild(element('p', {class: 'note'}, run.name + ' has no layer ' + layer));
            continue;
        }
        const parts = look.layers[layer];
        const weights = unpack(parts.weights), L = weights.shape[1];
        if (head >= weights.shape[0]) {
            box.appendChild(element('p', {class: 'note'}, run.name + ' has no head ' + head));
            continue;
        }
        shown.push({
            id,
            run,
            look,
            parts,
            weights,
            L,
            content: unpack(parts.content),
            position: unpack(parts.position),
            allowed: unpack(parts.allowed),
            valueShare: unpack(parts.value_share),
            gate: unpack(parts.gate)
        });
    }
    const at = (array, i, j, L) => array.values[(head * L + i) * L + j];
    const allowedAt = (s, i, j) => !s.allowed || s.allowed.values[i * s.L + j] === 1;
    // one scale for every chart shown: the largest value (weights) or magnitude (score parts)
    let range = 0;
    for (const s of shown) {
        const source = view === 'weights' ? s.weights : s[view];
        for (let i = 0; i < s.L; ++i) {
            for (let j = 0; j < s.L; ++j)
                if (allowedAt(s, i, j)) range = Math.max(range, Math.abs(at(source, i, j, s.L)));
        }
    }
    for (const s of shown) {
        const source = view === 'weights' ? s.weights : s[view];
        const tokens = s.look.tokens.map((t, k) => k + ' ' + t);
        const hover = (i, j) => {
            const w = at(s.weights, i, j, s.L), c = at(s.content, i, j, s.L), p = at(s.position, i, j, s.L);
            const lines =
                ['query ' + i + ' \'' + s.look.tokens[i] + '\'  ->  key ' + j + ' \'' + s.look.tokens[j] + '\''];
            if (!allowedAt(s, i, j)) {
                lines.push('masked: this pair does not attend');
            } else {
                lines.push(
                    'weight ' + format(w),
                    'score ' + format(c + p) + ' = content ' + format(c) + ' + position ' + format(p),
                    '  content: q_i . k_j / sqrt(Dh)');
                if (positionPart[s.run.position]) lines.push('  position: ' + positionPart[s.run.position]);
            }
            if (s.valueShare)
                lines.push(
                    'z_' + i + ' from a^V (Shaw\'s value term): ' + format(100 * s.valueShare.values[head * s.L + i]) +
                    '%');
            if (s.gate) lines.push('gate g (1 = relative): ' + format(s.gate.values[head * s.L + i]));
            return {
                lines,
                data: {
                    run: s.id,
                    i,
                    j,
                    weight: String(w),
                    content: String(c),
                    position: String(p),
                    masked: String(!allowedAt(s, i, j))
                }
            };
        };
        const svg = heatmap({
            rows: s.L,
            columns: s.L,
            rowLabels: tokens,
            columnLabels: tokens,
            range,
            value: (i, j) => (allowedAt(s, i, j) ? at(source, i, j, s.L) : null),
            colour: view === 'weights' ? sequentialColour : divergingColour,
            hover,
            legend: 'rows: queries i, columns: keys j; grey: masked',
        });
        if (s.gate) {  // the gated layer's gate for each query of the prompt, a curve per head
            const series = [...Array(s.gate.shape[0]).keys()].map(
                (h) =>
                    ({name: 'head ' + h, points: [...Array(s.L).keys()].map((i) => [i, s.gate.values[h * s.L + i]])}));
            const gates = figure(
                s.run.name + ': gates g per token, layer ' + layer + ' (1 = relative)',
                lineChart({series, xLabel: 'query position i', yLabel: 'g'}),
                s.run.name + '_layer' + layer + '_gates_per_token');
            gates.setAttribute('data-run', s.id);
            gates.setAttribute('data-kind', 'gates');
            box.appendChild(gates);
        }
        const name = s.run.name + '_layer' + layer + '_head' + head + '_' + view;
        const box_ = figure(
            s.run.name + ': layer ' + layer + ', head ' + head + ', ' + $('view').selectedOptions[0].text, svg, name);
        box_.setAttribute('data-run', s.id);
        box_.setAttribute('data-kind', 'attention');
        box.appendChild(box_);
    }
}

// Position parameters of run A (and B): per scheme, per layer.
function drawParameters() {
    const box = $('parameters');
    box.replaceChildren();
    const layer = Number($('layer').value || 0), head = Number($('head').value || 0);
    for (const id of selectedRuns()) {
        const run = state.runs[id], p = state.parameters[id];
        if (!p) continue;
        let shown = 0;  // this run's charts
        const add = (title, svg, name) => {
            ++shown;
            const f = figure(run.name + ': ' + title, svg, run.name + '_' + name);
            f.setAttribute('data-run', id);
            box.appendChild(f);
        };
        const layers = p.layers;
        const l = Math.min(layer, layers.length - 1), kind = layers[l].kind;
        if (kind === 'relative' || kind === 'gated') {
            for (const table of ['E_K', 'E_V']) {
                const t = unpack(layers[l][table]);
                if (!t) continue;
                const [tableHeads, K, Dh] = t.shape, h = tableHeads === 1 ? 0 : Math.min(head, tableHeads - 1);
                let range = 0;
                for (let k = 0; k < K * Dh; ++k) range = Math.max(range, Math.abs(t.values[h * K * Dh + k]));
                const distances = [...Array(K).keys()].map((r) => String(r - layers[l].k_left));
                add(table + ' of layer ' + l + (tableHeads === 1 ? ' (shared by the heads)' : ', head ' + h), heatmap({
                        rows: K,
                        columns: Dh,
                        rowLabels: distances,
                        columnLabels: [...Array(Dh).keys()].map(String),
                        range,
                        value: (r, d) => t.values[(h * K + r) * Dh + d],
                        colour: divergingColour,
                        legend: 'rows: clipped distance j - i, columns: dimension'
                    }),
                    table + '_layer' + l);
            }
            if (kind === 'gated') {
                add('gates g per head (1 = relative, 0 = absolute)', lineChart({
                        series: layers.map((x, k) => ({name: 'layer ' + k, points: x.gates.map((g, h_) => [h_, g])})),
                        xLabel: 'head',
                        yLabel: 'g'
                    }),
                    'gates');
            }
        } else if (kind === 't5') {
            const t = unpack(layers[l].bias), n = layers[l].distances.length;
            add('T5 bias over distance, layer ' + l, lineChart({
                    series: [...Array(t.shape[0]).keys()].map(
                        (h_) => ({
                            name: 'head ' + h_,
                            points: layers[l].distances.map((d, e) => [d, t.values[h_ * n + e]])
                        })),
                    xLabel: 'distance j - i',
                    yLabel: 'bias'
                }),
                't5_bias_layer' + l);
        } else if (kind === 'alibi') {
            add('ALiBi slopes m_h', lineChart({
                    series: [{name: 'slope', points: layers[0].slopes.map((m, h_) => [h_, m])}],
                    xLabel: 'head',
                    yLabel: 'm_h',
                    logY: true
                }),
                'alibi_slopes');
        } else if (kind === 'rope') {
            add('RoPE frequencies theta_t = base^(-2t/Dh)', lineChart({
                    series: [{name: 'theta_t', points: layers[0].frequencies.map((f, t) => [t, f])}],
                    xLabel: 'pair t',
                    yLabel: 'radians per position',
                    logY: true
                }),
                'rope_frequencies');
        }
        if (p.absolute) {
            const s = unpack(p.absolute.similarity), P = s.shape[0];
            const labels = [...Array(P).keys()].map(String);
            add(p.absolute.kind + ' positions: cosine similarity', heatmap({
                    rows: P,
                    columns: P,
                    rowLabels: labels,
                    columnLabels: labels,
                    range: 1,
                    colour: divergingColour,
                    value: (i, j) => s.values[i * P + j],
                    legend: 'position against position'
                }),
                'position_similarity');
        }
        if (shown === 0) box.appendChild(element('p', {class: 'note'}, run.name + ': no position parameters'));
    }
}

// Asks for the prompt's look in the selected runs, then redraws.
async function lookAtPrompt(prompt) {
    showError(null);
    state.prompt = prompt;
    const asked = ++state.asked;
    const runs = selectedRuns();
    try {
        const looks = await Promise.all(runs.map((id) => state.source.look(id, prompt)));
        if (asked !== state.asked) return;  // a later prompt or choice of runs was asked meanwhile
        state.looks = {};
        runs.forEach((id, k) => {
            state.looks[id] = looks[k];
        });
        layerAndHeadChoices();
        drawHeatmaps();
        drawParameters();
    } catch (error) {
        if (asked === state.asked) showError(error);
    }
}

async function loadParameters() {
    await Promise.all(selectedRuns().filter((id) => !state.parameters[id]).map(async (id) => {
        state.parameters[id] = await state.source.parameters(id);
    }));
    drawParameters();
}

async function start() {
    const stored = JSON.parse($('relgrad-data').textContent);
    state.source = stored ? storedSource(stored) : serverSource();
    $('source').textContent = state.source.description;
    try {
        state.runs = await state.source.runs();
        runsTable();
        const metrics = {};
        await Promise.all(state.runs.map(async (run) => {
            metrics[run.id] = await state.source.metrics(run.id);
        }));
        trainingCharts(metrics);
        const choices = state.runs.map((run) => [run.id, run.name]);
        fillSelect($('run-a'), choices);
        fillSelect($('run-b'), [['', 'none'], ...choices]);
        await loadParameters();
    } catch (error) {
        showError(error);
    }
    const promptText = () => (state.source.prompts ? $('prompt-choice').value : $('prompt').value);
    if (state.source.prompts) {
        $('prompt').parentElement.hidden = true;
        $('prompt-choice-label').hidden = false;
        fillSelect($('prompt-choice'), state.source.prompts.map((p) => [p, p]));
        $('prompt-choice').addEventListener('change', () => lookAtPrompt(promptText()));
        await lookAtPrompt(promptText());
    }
    $('prompt-form').addEventListener('submit', (event) => {
        event.preventDefault();
        lookAtPrompt(promptText());
    });
    // typing updates the view once the keys rest for a quarter of a second
    let typing = null;
    $('prompt').addEventListener('input', () => {
        clearTimeout(typing);
        typing = setTimeout(() => {
            if (promptText().trim() !== '') lookAtPrompt(promptText());
        }, 250);
    });
    for (const id of ['run-a', 'run-b']) {
        $(id).addEventListener('change', async () => {
            if (state.prompt !== null) await lookAtPrompt(state.prompt);
            await loadParameters();
        });
    }
    for (const id of ['layer', 'head'])
        $(id).addEventListener('change', () => {
            drawHeatmaps();
            drawParameters();
        });
    $('view').addEventListener('change', drawHeatmaps);
    // drawn and listening: the moment bench/explorer.py measures from the navigation's start
    document.body.setAttribute('data-ready', String(performance.now()));
}

start();
