"""The gateway's web page in a real headless Chromium (Debian's chromium + chromedriver):
load it, play a sentence, and check the audio element got playable audio, the page measured
the time to first audio, and the console holds no error. A screenshot is kept in out/."""

from __future__ import annotations

from tests.support.browser import ARTIFACTS, wait_for


def test_the_page_plays_streamed_speech(gateway, browser):
    from selenium.webdriver.common.by import By

    browser.get(gateway.url + "/")
    voices = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="the voice list"
    )
    assert [v.get_attribute("value") for v in voices][:2] == ["joe", "joe-exact"]
    assert voices[0].text.startswith("joe [en-us]")  # each voice with its language
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys("The page asks the gateway, and the gateway asks Triton.")
    browser.find_element(By.ID, "play").click()
    audio = browser.find_element(By.ID, "audio")
    wait_for(lambda: audio.get_attribute("data-complete") == "true", what="the whole response")
    first_audio_ms = wait_for(
        lambda: audio.get_attribute("data-first-audio-ms"), what="playback to start"
    )
    state = browser.execute_script(
        "const a = document.getElementById('audio');"
        "return {duration: a.duration, ready: a.readyState, error: a.error && a.error.message,"
        " buffered: a.buffered.length ? a.buffered.end(0) : 0};"
    )
    # Read-along: one span per word sent, and the words light up as the audio plays.
    spans = browser.find_elements(By.CSS_SELECTOR, "#words span")
    assert [
        s.text for s in spans
    ] == "The page asks the gateway, and the gateway asks Triton.".split()
    assert browser.find_element(By.ID, "words").text.startswith("The page asks")
    wait_for(
        lambda: int(audio.get_attribute("data-words-highlighted") or 0) >= 5,
        what="words to light up while the audio plays",
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "gateway-page.png"))
    print(f"\npage: first audio after {first_audio_ms} ms, {state}")
    assert state["error"] is None
    assert state["ready"] >= 2 and state["buffered"] > 1.5  # about 3 s of speech
    assert "First audio after" in browser.find_element(By.ID, "timing").text
    assert "Done:" in browser.find_element(By.ID, "status").text
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_the_page_speaks_its_ssml_example_and_reads_along_without_markup(gateway, browser):
    from selenium.webdriver.common.by import By

    browser.get(gateway.url + "/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="voices")
    browser.find_element(By.ID, "ssml-example").click()
    assert browser.find_element(By.ID, "text").get_attribute("value").startswith("<speak>")
    browser.find_element(By.ID, "play").click()
    audio = browser.find_element(By.ID, "audio")
    wait_for(lambda: audio.get_attribute("data-complete") == "true", what="the whole response")
    shown = browser.find_element(By.ID, "words").text
    assert shown.startswith("SSML works here too.") and "<" not in shown, shown
    spans = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#words span")]
    assert spans[-4:] == ["SSML", "is", "spelled", "out."]  # spelled out, still one word
    assert "Done:" in browser.find_element(By.ID, "status").text
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_the_page_shows_errors_from_the_api(gateway, browser):
    from selenium.webdriver.common.by import By

    browser.get(gateway.url + "/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="voices")
    speed = browser.find_element(By.ID, "speed")
    speed.clear()
    speed.send_keys("9")
    browser.find_element(By.ID, "play").click()
    status = browser.find_element(By.ID, "status")
    wait_for(lambda: "speed" in status.text, what="the error message")
    assert "error" in status.get_attribute("class")


def test_stop_and_errors_end_playback_and_the_controls_fit(gateway, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(gateway.url + "/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="voices")
    audio = browser.find_element(By.ID, "audio")
    status = browser.find_element(By.ID, "status")
    # Play, Stop and Download sit on one line at a 1000 px window (Download used to wrap).
    tops = {browser.find_element(By.ID, b).location["y"] for b in ("play", "stop", "download")}
    assert len(tops) == 1, tops
    Select(browser.find_element(By.ID, "format")).select_by_visible_text("pcm")
    assert "24 kHz" in browser.find_element(By.ID, "format-hint").text

    def src() -> str | None:
        return browser.execute_script("return document.getElementById('audio').getAttribute('src')")

    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys("A long text to stop half way. " * 12)
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: audio.get_attribute("data-first-audio-ms"), what="playback to start")
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: status.text == "Stopped.", what="the stop")
    assert src() is None and audio.get_attribute("data-complete") is None

    text.clear()
    text.send_keys("Something short that plays.")
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: audio.get_attribute("data-complete") == "true", what="the response")
    assert src() is not None
    speed = browser.find_element(By.ID, "speed")
    speed.clear()
    speed.send_keys("9")
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: "speed" in status.text, what="the error message")
    assert src() is None  # the previous audio does not play on under the error


def test_type_as_you_go_speaks_each_clause_while_typing_and_cancel_drops_the_rest(gateway, browser):
    from selenium.webdriver.common.by import By

    browser.get(gateway.url + "/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="voices")
    live = browser.find_element(By.ID, "live")
    status = browser.find_element(By.ID, "live-status")
    browser.find_element(By.ID, "live-start").click()
    wait_for(lambda: "Listening" in status.text, what="the session to open")
    live.send_keys("Hello there, this is typed. ")
    # AudioPiece while the typing goes on: two pieces ("Hello there," and the rest of the
    # sentence) before anything else is typed or End is pressed.
    wait_for(lambda: int(live.get_attribute("data-pieces") or 0) >= 2, what="two pieces")
    assert "after you started typing" in status.text
    live.send_keys("And this sentence is cut short by a cancel")
    browser.find_element(By.ID, "live-cancel").click()
    wait_for(lambda: "Cancelled" in status.text, what="the cancel's answer")
    live.send_keys(" Then one more. ")
    browser.find_element(By.ID, "live-end").click()
    wait_for(lambda: status.text.startswith("Done:"), what="the end of the session")
    assert status.text == "Done: 3 piece(s)."  # the two, then "Then one more."
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
