(** Extracts the model to OCaml for the fixture replay (replay/). *)
From Coq Require Import Extraction ExtrOcamlBasic ExtrOcamlNatInt.
From Egress Require Import Model.
Extraction Language OCaml.
Extraction "replay/model.ml" step init st_of out_of ch_of.
