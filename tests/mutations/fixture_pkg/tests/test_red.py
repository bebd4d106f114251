def test_red_on_the_clean_tree():
    assert 1 + 1 == 3, "deliberately red: the runner must refuse to judge mutants with it (PRE_RED)"
