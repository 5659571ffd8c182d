"""The inputs of ``calmon check / fit / apply / report``: files read whole and joined into a dataset."""
