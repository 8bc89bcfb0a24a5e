"""user_options are checked against the roles the user holds, on every start."""

import pytest
from quota_tables import INJECTED, TABLE_TEXT

from spawner.quota.form import options_from_form, render_form
from spawner.quota.loader import parse_quota_table
from spawner.quota.options import OptionsError, resolve_choice

TABLE = parse_quota_table(TABLE_TEXT, "q.yaml")


def choices(user):
    return TABLE.choices_for(user)


def test_defaults_to_first_choice():
    assert resolve_choice(choices("lead"), {}).key == "small/pytorch"
    assert resolve_choice(choices("lead"), None).key == "small/pytorch"
    assert resolve_choice(choices("lead"), {"profile": "big"}).key == "big/pytorch"
    assert resolve_choice(choices("lead"), {"image": "paddle"}).key == "small/paddle"
    assert resolve_choice(choices("lead"), {"profile": "small", "image": "paddle"}).key == (
        "small/paddle"
    )


@pytest.mark.parametrize("options, status, words", INJECTED)
def test_refusals_are_plain_sentences(options, status, words):
    with pytest.raises(OptionsError) as info:
        resolve_choice(choices("anyone"), options)
    assert info.value.status == status
    assert words in info.value.message
    assert len(info.value.message) < 300


def test_role_held_by_others_only():
    with pytest.raises(OptionsError):
        resolve_choice(choices("solo"), {"profile": "small"})


def test_no_role_is_forbidden():
    with pytest.raises(OptionsError) as info:
        resolve_choice([], {})
    assert info.value.status == 403
    assert "no role" in info.value.message


def test_form_lists_choices_with_limits_and_escapes():
    html = render_form(choices("lead"))
    assert html.count('type="radio"') == 3
    assert "8 CPUs · 32 GiB memory · 8 GiB shared memory" in html
    assert "1 CPU · 1 GiB memory" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "PyTorch &lt;2.7&gt; &amp; CUDA" in html
    assert 'value="small/pytorch" checked' in html


def test_form_keeps_previous_selection():
    assert 'value="big/pytorch" checked' in render_form(choices("lead"), "big/pytorch")
    assert 'value="small/pytorch" checked' in render_form(choices("lead"), "gone/thing")


def test_single_choice_shows_no_form():
    assert render_form(choices("solo")) == ""
    assert render_form([]) == ""
    # ...unless the saved choice is gone, so the user can pick the new one
    assert 'value="big/pytorch" checked' in render_form(choices("solo"), always=True)


def test_options_from_form_and_query():
    assert options_from_form({"choice": ["big/pytorch"]}) == {"profile": "big", "image": "pytorch"}
    assert options_from_form({"profile": "big", "image": "paddle"}) == {
        "profile": "big", "image": "paddle"}
    assert options_from_form({}) == {}


def test_form_says_what_each_image_holds_from_its_label():
    cs = choices("lead")
    ref = cs[0].image.image
    html = render_form(cs, contents={ref: "PyTorch 2.14.1 · CUDA 13.0 <b>"})
    assert html.count("quota-image-contents") == sum(c.image.image == ref for c in cs)
    assert "PyTorch 2.14.1 · CUDA 13.0 &lt;b&gt;" in html
    assert "quota-image-contents" not in render_form(cs)  # no label read: nothing claimed
