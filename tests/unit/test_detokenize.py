"""The zero-shot detokenisers give, byte for byte, what the reference's dataloader.py functions
give (wt_detokenizer, ptb_detokenizer, lm1b_detokenizer, lambada_detokenizer,
scientific_papers_detokenizer at kuleshov-group/mdlm c112c52), so Table 3 scores the same text.

The lines are written in each corpus' own tokenisation (WikiText's " @-@ " separators and
"= = heading = =" lines, PTB's N and <unk>, LM1B's spaced punctuation, LAMBADA's curly quotes,
the scientific papers' @xmath and spaced equations); each expected output is the reference
function's output on that line, recorded by running the reference functions.
"""

import pytest

from mdlm_cli.data import detokenize

CASES = [
    ('wikitext_detokenize',
     ' = Valkyria Chronicles III = \n',
     ' = Valkyria Chronicles III =\n'),
    ('wikitext_detokenize',
     ' = = Gameplay = = \n',
     ' == Gameplay ==\n'),
    ('wikitext_detokenize',
     ' = = = Reception = = = \n',
     ' === Reception ===\n'),
    ('wikitext_detokenize',
     ' = = = = Sales = = = = \n',
     ' ==== Sales ====\n'),
    ('wikitext_detokenize',
     (' Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . Va'
      'lkyria of the Battlefield 3 ) , commonly referred to as Valkyria Chronicles III '
      'outside Japan , is a tactical role @-@ playing video game . \n'),
     (' Senjō no Valkyria 3: Unrecorded Chronicles (Japanese: 戦場のヴァルキュリア3, lit. Valkyri'
      'a of the Battlefield 3), commonly referred to as Valkyria Chronicles III outside'
      ' Japan, is a tactical role-playing video game.\n')),
    ('wikitext_detokenize',
     (" The game 's budget was $ 1 @.@ 5 million , and it sold 102 @,@ 000 copies in it"
      's first week ; critics called it " a triumph " . \n'),
     (" The game's budget was $ 1.5 million, and it sold 102,000 copies in its first we"
      'ek; critics called it "a triumph".\n')),
    ('wikitext_detokenize',
     (" Temperatures reach 35 ° C ( 95 ° F ) in summer , and the 1998 – 99 season 's ' "
      "best ' month was July ! \n"),
     (" Temperatures reach 35°C (95°F) in summer, and the 1998 – 99 season's' best ' mo"
      'nth was July!\n')),
    ('wikitext_detokenize',
     (" In the 1920s ' boom , players ' wages rose by 20 % ; was it the clubs ' doing ?"
      ' \n'),
     " In the 1920s'boom, players' wages rose by 20 %; was it the clubs' doing?\n"),
    ('wikitext_detokenize',
     (" The list [ 1 ] includes { braced } items and N entries , with a ratio of /' 4/ "
      '. \n'),
     " The list [1] includes {braced} items and 1 entries, with a ratio of /'[0-9]/.\n"),
    ('ptb_detokenize',
     ('aer banknote berlitz calloway centrust cluett fromstein gitano guterman hydro-qu'
      'ebec ipo kia memotec mlx nahb punts rake regatta rubens sim snack-food ssangyong'
      ' swapo wachter'),
     ('aer banknote berlitz calloway centrust cluett fromstein gitano guterman hydro-qu'
      'ebec ipo kia memotec mlx nahb punts rake regatta rubens sim snack-food ssangyong'
      ' swapo wachter')),
    ('ptb_detokenize',
     'pierre <unk> N years old will join the board as a nonexecutive director nov. N',
     'pierre ? 1 years old will join the board as a nonexecutive director nov. N'),
    ('ptb_detokenize',
     ("the company 's shares rose $ N to $ N N N in new york stock exchange composite t"
      'rading'),
     ("the company's shares rose $1 to $1 1 1 in new york stock exchange composite trad"
      'ing')),
    ('ptb_detokenize',
     ("it was n't clear whether the investors ' $ N million offer would win a N N \\/ N "
      '% stake'),
     ("it wasn't clear whether the investors' $1 million offer would win a 1 1 / 1 % st"
      'ake')),
    ('ptb_detokenize',
     'the index fell N N to N N while # N issues were unchanged',
     'the index fell 1 1 to 1 1 while #1 issues were unchanged'),
    ('ptb_detokenize',
     'volume was N N N N N N N N N N N N N N N N N N N N N N N N N N N shares',
     'volume was 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 shares'),
    ('ptb_detokenize',
     " the dealers ' bids \n were lower",
     " the dealers' bids\nwere lower"),
    ('lm1b_detokenize',
     'The company said it expects revenue of $ 1.5 billion , up 12 % from last year .',
     'The company said it expects revenue of $1.5 billion, up 12 % from last year.'),
    ('lm1b_detokenize',
     '" We \'re not going to stop , " he said .',
     '"We\'re not going to stop," he said.'),
    ('lm1b_detokenize',
     'Visit http : / / www.example.com / news or https : / / example.org for details .',
     'Visit http://www.example.com/news or https://example.org for details.'),
    ('lm1b_detokenize',
     'Prices rose ( about 3 % ) in the U.K. ; shares fell to £ 4.20 : a record low .',
     'Prices rose (about 3 %) in the U.K.; shares fell to £4.20: a record low.'),
    ('lm1b_detokenize',
     "What 's next ? Nobody knows !",
     "What's next? Nobody knows!"),
    ('lm1b_detokenize',
     "It was ' the best ' deal , the 1990s ' biggest [ citation needed ] .",
     "It was 'the best' deal, the 1990s ' biggest [citation needed] ."),
    ('lm1b_detokenize',
     'The " 10 $ " bill was sold for $ 20 .',
     'The "10 $" bill was sold for $20.'),
    ('lambada_detokenize',
     "“I'm not sure,” she said. “Maybe tomorrow.”   ",
     '\n"I\'m not sure," she said. "Maybe tomorrow."'),
    ('lambada_detokenize',
     '  he looked at the door and then at his brother',
     '\nhe looked at the door and then at his brother'),
    ('papers_detokenize',
     ('additive models @xcite provide an important family of models for semiparametric '
      'regression or classification . some reasons for their success are their flexibil'
      'ity ( see eq . [ eq1 ] ) and interpretability . \n it is well - known that good e'
      'stimators in additive models are less prone to the curse of dimensionality .'),
     ('additive models @xcite provide an important family of models for semiparametric '
      'regression or classification. some reasons for their success are their flexibili'
      'ty (see eq. [eq1]) and interpretability.\nit is well - known that good estimators'
      ' in additive models are less prone to the curse of dimensionality.')),
    ('papers_detokenize',
     ('the prevalence of hypertension was 24.5% ( n = 1,234 ) in men and 18 % in women '
      '; p < 0.05 . the cost was $ 1 @,@ 200 per patient at 37 ° c , i.e. , " high " . '
      "\n = = methods = = \n patients ' records were reviewed ."),
     ('the prevalence of hypertension was 24.5% (n = 1,234) in men and 18 % in women; p'
      ' < 0.05. the cost was $1,200 per patient at 37°c, i.e., "high".\n== methods ==\npa'
      "tients' records were reviewed.")),
]


@pytest.mark.parametrize(("function", "line", "expected"), CASES)
def test_detokeniser_matches_the_reference_byte_for_byte(function, line, expected):
    assert getattr(detokenize, function)(line) == expected


def test_every_detokeniser_is_held_to_the_reference():
    public = {name for name in vars(detokenize) if name.endswith("_detokenize")}
    assert public == {case[0] for case in CASES}


def test_the_order_of_the_rules_is_the_reference_order():
    """Three places where another order gives other text (each was wrong before): PTB turns
    "$ N" into "$1" only because " N " becomes " 1 " first; WikiText strips the spaces inside
    single quotes and around a degree sign; LM1B joins "$ " only after the quote rules ran."""
    assert detokenize.ptb_detokenize("rose $ N to $ N") == "rose $1 to $ N"
    assert detokenize.wikitext_detokenize(" 35 ° C in ' hot ' weeks ") == " 35°C in 'hot' weeks "
    # and the contraction rule runs last, so a quoted word starting with s loses its space
    assert detokenize.wikitext_detokenize(" in ' summer ' ") == " in'summer' "
    assert detokenize.lm1b_detokenize('The " 10 $ " bill') == 'The "10 $" bill'
