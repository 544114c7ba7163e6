"""The model cards a router keeps across its restarts (`--model-cards-file`): what it reads back, and what not."""

import json

from fleetserve.router.served import read_model_cards, write_model_cards


def test_cards_are_read_back_for_the_served_names_only_and_a_bad_file_is_no_card(tmp_path):
    path = tmp_path / "cards.json"
    card = {"id": "tiny", "object": "model", "max_model_len": 2048}
    write_model_cards(str(path), {"tiny": card, "other": {"id": "other"}})
    assert read_model_cards(str(path), ("tiny",)) == {"tiny": card}  # another model's card is not this fleet's
    assert read_model_cards(str(path), ()) == {} and read_model_cards(None, ("tiny",)) == {}
    for text in ("{not json", "[]", json.dumps({"tiny": {"id": "renamed"}}), json.dumps({"tiny": "x"})):
        path.write_text(text)
        assert read_model_cards(str(path), ("tiny",)) == {}, text
    assert read_model_cards(str(tmp_path / "missing.json"), ("tiny",)) == {}
    write_model_cards(str(tmp_path / "no-such-dir" / "cards.json"), {"tiny": card})  # logged, not raised
