"""The explorer's page in a real browser (headless Chromium): it loads with no console error, a
prompt typed redraws the heatmaps whose hover shows the API's values (which are `relgrad
attention`'s), layer, head and a second run switch, charts export as valid PNG and SVG, and the
exported file draws its charts from file:// with the network off."""
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest
from matplotlib import image as matplotlib_image
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from conftest import ORDER, RELGRAD, unpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from headless_chromium import chromium, wait_until_ready  # noqa: E402

ID = {name: n for n, name in enumerate(ORDER)}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    downloads = str(tmp_path_factory.mktemp("downloads"))
    with chromium(downloads=downloads) as b:
        b.downloads = downloads
        yield b


def console_errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def heatmaps(browser):
    return browser.find_elements(By.CSS_SELECTOR, '#heatmaps figure[data-kind="attention"]')


def cells(browser):
    """The cells of each attention heatmap shown, read in one step (the page may redraw meanwhile)."""
    return browser.execute_script("return [...document.querySelectorAll('#heatmaps figure[data-kind=\"attention\"]')]"
                                  ".map((f) => f.querySelectorAll('svg > g.cells > rect').length)")


def hover_cell(browser, chart, i, j):
    """The tooltip's data after moving the mouse onto cell (i, j) of a heatmap <figure>."""
    cells = chart.find_elements(By.CSS_SELECTOR, "svg > g.cells > rect")
    length = int(round(len(cells) ** 0.5))
    ActionChains(browser).move_to_element(cells[i * length + j]).perform()
    tooltip = browser.find_element(By.ID, "tooltip")
    WebDriverWait(browser, 5).until(lambda b: tooltip.get_attribute("data-i") == str(i)
                                    and tooltip.get_attribute("data-j") == str(j))
    return {name: tooltip.get_attribute("data-" + name) for name in ("run", "i", "j", "weight", "content", "position",
                                                                     "masked")}, tooltip.text


def type_prompt(browser, prompt, length=None):
    """Types the prompt (of `length` tokens: by default its words) and waits for its heatmaps."""
    field = browser.find_element(By.ID, "prompt")
    field.clear()
    field.send_keys(prompt)
    # typing redraws after the keys rest: wait for heatmaps of this prompt's length
    length = length or len(prompt.split())
    WebDriverWait(browser, 20).until(lambda b: cells(b)[:1] == [length * length])


def test_the_page_loads_with_no_console_error_and_shows_every_run(browser, server):
    browser.get(server.url)
    wait_until_ready(browser)
    assert console_errors(browser) == []
    assert browser.find_element(By.ID, "error").text == ""
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tr[data-run]")
    assert [row.find_elements(By.TAG_NAME, "td")[0].text for row in rows] == ORDER
    charts = [f.get_attribute("data-chart") for f in browser.find_elements(By.CSS_SELECTOR, "#training figure")]
    assert charts[:2] == ["loss", "learning_rate"] and "by_length" in charts
    # each run's loss curve is drawn: a path per run
    loss = browser.find_element(By.CSS_SELECTOR, '#training figure[data-chart="loss"]')
    assert len(loss.find_elements(By.CSS_SELECTOR, "svg > path[stroke]")) == len(ORDER)


def test_typing_a_prompt_draws_heatmaps_whose_hover_shows_the_apis_values(browser, server, runs, tmp_path):
    browser.get(server.url)
    wait_until_ready(browser)
    Select(browser.find_element(By.ID, "run-a")).select_by_value(str(ID["relative"]))
    type_prompt(browser, "4 5 6 7")
    look = server.look(ID["relative"], "4 5 6 7")
    out = str(tmp_path / "npy")
    subprocess.run([RELGRAD, "attention", runs["relative"], "--prompt", "4 5 6 7", "--out", out], check=True,
                   capture_output=True)
    weights = np.load(os.path.join(out, "layer0.npy"))
    content, position = unpack(look["layers"][0]["content"]), unpack(look["layers"][0]["position"])
    for i, j in [(0, 0), (2, 1), (3, 3)]:
        shown, text = hover_cell(browser, heatmaps(browser)[0], i, j)
        assert float(shown["weight"]) == unpack(look["layers"][0]["weights"])[0, i, j] == weights[0, i, j]
        assert float(shown["content"]) == content[0, i, j] and float(shown["position"]) == position[0, i, j]
        assert f"query {i} '" in text and "content" in text and "Shaw" in text and "from a^V" in text
    # a longer prompt redraws
    type_prompt(browser, "4 5 6 7 8 9")
    assert "answers class" in browser.find_element(By.ID, "answers").text
    assert console_errors(browser) == []


def test_layer_head_and_a_second_run_switch(browser, server):
    browser.get(server.url)
    wait_until_ready(browser)
    Select(browser.find_element(By.ID, "run-a")).select_by_value(str(ID["lm"]))
    type_prompt(browser, "the cat", length=7)  # a character model
    Select(browser.find_element(By.ID, "layer")).select_by_value("1")
    Select(browser.find_element(By.ID, "head")).select_by_value("1")
    chart = heatmaps(browser)[0]
    assert "layer 1, head 1" in chart.text
    look = server.look(ID["lm"], "the cat")
    shown, text = hover_cell(browser, chart, 5, 2)
    assert float(shown["weight"]) == unpack(look["layers"][1]["weights"])[1, 5, 2]
    shown, text = hover_cell(browser, chart, 2, 5)  # a later key: masked in a causal model
    assert shown["masked"] == "true" and "masked" in text
    # the position part alone
    Select(browser.find_element(By.ID, "view")).select_by_value("position")
    assert "position part" in heatmaps(browser)[0].text
    # a prompt both kinds of run read (characters here, symbol ids there), then another run
    type_prompt(browser, "4 5 6", length=5)
    Select(browser.find_element(By.ID, "run-a")).select_by_value(str(ID["relative"]))
    WebDriverWait(browser, 20).until(lambda b: cells(b) == [9])
    # and a second run beside it, each hover its own run's
    Select(browser.find_element(By.ID, "run-b")).select_by_value(str(ID["alibi"]))
    WebDriverWait(browser, 20).until(lambda b: cells(b) == [9, 9])
    for chart, name in zip(heatmaps(browser), ["relative", "alibi"]):
        shown, text = hover_cell(browser, chart, 1, 2)
        assert shown["run"] == str(ID[name])
        assert float(shown["position"]) == unpack(server.look(ID[name], "4 5 6")["layers"][1]["position"])[1, 1, 2]
    assert "ALiBi" in text
    # ALiBi's slopes and Shaw's tables among the parameters
    parameters = browser.find_element(By.ID, "parameters").text
    assert "ALiBi slopes" in parameters and "E_K of layer 1" in parameters
    assert console_errors(browser) == []
    # a prompt the run cannot read: the page says why (and the browser logs the API's 400)
    browser.find_element(By.ID, "prompt").send_keys(" x")
    WebDriverWait(browser, 10).until(lambda b: "'x' is not a symbol id" in b.find_element(By.ID, "error").text)
    assert [entry for entry in console_errors(browser) if "400 (Bad Request)" not in entry["message"]] == []


def test_a_gated_run_shows_its_gate_per_token_and_the_runs_files(browser, server, runs):
    browser.get(server.url)
    wait_until_ready(browser)
    Select(browser.find_element(By.ID, "run-a")).select_by_value(str(ID["gated"]))
    type_prompt(browser, "4 5 6 7 8")
    gates = browser.find_element(By.CSS_SELECTOR, '#heatmaps figure[data-kind="gates"]')
    assert "gates g per token, layer 0" in gates.text
    assert len(gates.find_elements(By.CSS_SELECTOR, "svg > path[stroke]")) == 2  # a curve per head
    shown, text = hover_cell(browser, heatmaps(browser)[0], 2, 3)
    gate = unpack(server.look(ID["gated"], "4 5 6 7 8")["layers"][0]["gate"])
    assert f"gate g (1 = relative): {float(gate[0, 2]):.4g}" in text  # head 0, query 2
    # each run's config.json and summary.json, behind a click
    details = browser.find_element(By.CSS_SELECTOR, f'#run-files details[data-run="{ID["gated"]}"]')
    details.click()
    with open(os.path.join(runs["gated"], "config.json")) as f:
        assert json.loads(details.find_element(By.TAG_NAME, "pre").text)["config"] == json.load(f)
    assert console_errors(browser) == []


def wait_for_file(directory, suffix):
    for _ in range(100):
        done = [f for f in os.listdir(directory) if f.endswith(suffix)]
        if done:
            return os.path.join(directory, done[0])
        time.sleep(0.1)
    raise AssertionError(f"no {suffix} file was downloaded")


def test_a_chart_exports_as_valid_png_and_svg(browser, server):
    browser.get(server.url)
    wait_until_ready(browser)
    Select(browser.find_element(By.ID, "run-a")).select_by_value(str(ID["relative"]))
    type_prompt(browser, "4 5 6 7")
    chart = heatmaps(browser)[0]
    for name in os.listdir(browser.downloads):
        os.remove(os.path.join(browser.downloads, name))
    chart.find_element(By.CSS_SELECTOR, 'button[data-export="svg"]').click()
    svg = ElementTree.parse(wait_for_file(browser.downloads, ".svg")).getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}rect")) >= 16
    chart.find_element(By.CSS_SELECTOR, 'button[data-export="png"]').click()
    png = wait_for_file(browser.downloads, ".png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib_image.imread(png)
    assert pixels.shape[0] > 100 and len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 8


def coloured(element, path):
    """How much of a chart's screenshot is in colour: the share of its pixels whose channels differ
    by more than 0.1 (text, axes and the background are grey, the data is coloured)."""
    element.screenshot(path)
    pixels = matplotlib_image.imread(path)[..., :3]
    return float((pixels.max(axis=-1) - pixels.min(axis=-1) > 0.1).mean())


def test_the_exported_file_draws_from_disk_with_the_network_off(browser, runs, tmp_path):
    out = str(tmp_path / "view.html")
    done = subprocess.run([RELGRAD, "explore", runs["relative"], runs["alibi"], "--export", out, "--prompt", "4 5 6 7",
                           "--prompt", "8 9"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    browser.set_network_conditions(offline=True, latency=0, download_throughput=0, upload_throughput=0)
    try:
        browser.get("file://" + out)
        wait_until_ready(browser)
        assert console_errors(browser) == []
        # nothing fetched: the page holds its script, style and data
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert len(heatmaps(browser)) == 1
        # drawn, not blank: 15 % of this heatmap is in colour, 0.9 % with its cells removed (its
        # colour scale); 0.9 % of the loss chart, 0.06 % without its curves (its legend's names)
        heatmap_chart = heatmaps(browser)[0]
        loss_chart = browser.find_element(By.CSS_SELECTOR, '#training figure[data-chart="loss"]')
        assert coloured(heatmap_chart, str(tmp_path / "heatmap.png")) > 0.05
        assert coloured(loss_chart, str(tmp_path / "loss.png")) > 0.003
        Select(browser.find_element(By.ID, "prompt-choice")).select_by_value("8 9")
        WebDriverWait(browser, 10).until(lambda b: cells(b) == [4])
        Select(browser.find_element(By.ID, "run-b")).select_by_value("1")
        WebDriverWait(browser, 10).until(lambda b: cells(b) == [4, 4])
    finally:
        browser.delete_network_conditions()
